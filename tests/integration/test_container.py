"""The container image: its definition always, its runtime behaviour without an engine (the
image's ENV, ENTRYPOINT, CMD and HEALTHCHECK run here as written in the Dockerfile), and a real
build and run where an engine works."""

from __future__ import annotations

import json
import os
import pwd
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.helpers import REPO, write_tiny_package

DOCKERFILE = (REPO / "Dockerfile").read_text()
ENTRYPOINT_SCRIPT = REPO / "deploy" / "container" / "entrypoint.sh"
# Where the image's install puts the agent (scripts/install-device.sh --container).
IMAGE_AGENT = "/opt/edgeagent/bin/edgeagent"
# The throw-away user the image's user stands for here (the machine has no edgeagent user).
STAND_IN_USER = "nobody"


def instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) of each Dockerfile instruction: comments dropped, continuations
    joined."""
    found: list[tuple[str, str]] = []
    pending = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        keyword, _, arguments = (pending + stripped).partition(" ")
        pending = ""
        found.append((keyword.upper(), arguments.strip()))
    return found


def runtime_stage() -> list[tuple[str, str]]:
    """The instructions of the image's last stage (what `docker run` gets)."""
    steps = instructions(DOCKERFILE)
    last = max(i for i, (keyword, _) in enumerate(steps) if keyword == "FROM")
    return steps[last + 1 :]


def one(keyword: str) -> str:
    (arguments,) = [a for k, a in runtime_stage() if k == keyword]
    return arguments


def image_env() -> dict[str, str]:
    """The ENV of the runtime stage, ``$PATH`` expanded against this machine's."""
    env: dict[str, str] = {}
    for keyword, arguments in runtime_stage():
        if keyword == "ENV":
            for pair in shlex.split(arguments):
                name, _, value = pair.partition("=")
                env[name] = value.replace("$PATH", os.environ.get("PATH", "/usr/bin:/bin"))
    return env


def copied_to(destination: str) -> Path:
    """The checkout file that the runtime stage COPYs to ``destination``."""
    for keyword, arguments in runtime_stage():
        parts = arguments.split()
        if keyword == "COPY" and not parts[0].startswith("--") and parts[-1] == destination:
            return REPO / parts[0]
    raise AssertionError(f"the image copies nothing to {destination}")


def host_argv(argv: list[str]) -> list[str]:
    """An image command line as it runs here: the image's agent is this checkout's, and the
    entrypoint is the checkout file the Dockerfile copies there."""
    entrypoint = json.loads(one("ENTRYPOINT"))[0]
    mapped: list[str] = []
    for arg in argv:
        if arg == IMAGE_AGENT:
            mapped += [sys.executable, "-m", "edgeagent.cli"]
        elif arg == entrypoint:
            mapped += ["sh", str(copied_to(entrypoint))]
        else:
            mapped.append(arg)
    return mapped


def healthcheck_command() -> list[str]:
    _, _, command = one("HEALTHCHECK").partition("CMD ")
    return json.loads(command)


class Container:
    """The image's volumes as directories of one temporary root, and its environment."""

    def __init__(self, root: Path) -> None:
        self.volumes = {v: root / v.strip("/").replace("/", "-") for v in json.loads(one("VOLUME"))}
        env = image_env()
        if os.geteuid() == 0:
            env["EDGEAGENT_USER"] = STAND_IN_USER
        self.env = {
            "PYTHONPATH": str(REPO),
            "HOME": str(root),
            **{k: str(self.volumes.get(v, v)) for k, v in env.items()},
        }
        self.cwd = self.volumes.get(one("WORKDIR"), root)

    def run(self, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(
            host_argv(argv), env=self.env, cwd=self.cwd, capture_output=True, text=True,
            timeout=60, **kwargs,
        )  # fmt: skip


@pytest.fixture
def container() -> Iterator[Container]:
    """A root the stand-in user can reach (pytest's own temp tree is root's alone, 0700)."""
    root = Path(tempfile.mkdtemp(prefix="edgeagent-image-"))
    root.chmod(0o755)
    try:
        for directory in Container(root).volumes.values():
            directory.mkdir(mode=0o755)  # root's, as Docker makes a missing bind-mount source
        yield Container(root)
    finally:
        shutil.rmtree(root)


def _engine() -> str | None:
    """docker or podman, when its daemon answers (a client alone cannot build)."""
    for name in ("docker", "podman"):
        path = shutil.which(name)
        if path and subprocess.run([path, "info"], capture_output=True, timeout=30).returncode == 0:
            return path
    return None


def test_the_image_is_multi_stage_with_volumes_health_and_ports() -> None:
    lines = [line.strip() for line in DOCKERFILE.splitlines()]
    assert sum(line.startswith("FROM ") for line in lines) == 2
    assert "FROM ${PYTHON_IMAGE} AS build" in lines
    assert "ARG PYTHON_IMAGE=python:3.11-slim-bookworm" in lines
    assert 'VOLUME ["/models", "/var/lib/edgeagent", "/run/edgeagent"]' in lines
    assert "EXPOSE 8080 8081" in lines  # v2 HTTP and gRPC: KServe's ports
    # the agent never runs as root: the entrypoint drops to this user (checked below)
    assert image_env()["EDGEAGENT_USER"] == "edgeagent"
    assert 'useradd --system --uid "$EDGEAGENT_UID" --gid edgeagent' in DOCKERFILE
    # fixed ids outside the ranges a host hands out (below 1000, up to 60000), build args
    ids = dict(a.partition("=")[::2] for k, a in runtime_stage() if k == "ARG" and "=" in a)
    for name in ("EDGEAGENT_UID", "EDGEAGENT_GID"):
        assert 60000 < int(ids[name]) < 61184, name  # below systemd's dynamic users
    assert 'groupadd --system --gid "$EDGEAGENT_GID" edgeagent' in DOCKERFILE
    # the image installs with the board's own script, in container mode
    assert "RUN install-device.sh --container --source /dist/edgeagent-*.whl" in DOCKERFILE
    # the build context carries the entrypoint (.dockerignore excludes everything else)
    ignored = (REPO / ".dockerignore").read_text().splitlines()
    assert f"!{copied_to(json.loads(one('ENTRYPOINT'))[0]).relative_to(REPO)}" in ignored


def test_the_healthcheck_asks_the_socket_not_tcp() -> None:
    """Under the default config every TCP request without a token is 401: a TCP probe fails."""
    assert healthcheck_command() == [IMAGE_AGENT, "health"]


def test_the_image_agent_is_healthy_once_ready_and_unhealthy_when_down(
    container: Container,
) -> None:
    """ENTRYPOINT + CMD and the HEALTHCHECK, as the Dockerfile writes them, with the image's
    ENV; as a stand-in for the image's user when this runs as root. Port 0: TCP plays no part
    (the health check must not need it) and parallel runs cannot collide."""
    write_tiny_package(container.volumes["/models"] / "tiny")
    if os.geteuid() == 0:
        probe = container.run(
            ["setpriv", f"--reuid={STAND_IN_USER}", "--clear-groups", sys.executable, "-c",
             "import edgeagent.cli"]
        )  # fmt: skip
        if probe.returncode != 0:
            pytest.skip(f"{STAND_IN_USER} cannot run this interpreter: {probe.stderr[-300:]}")
    command = json.loads(one("ENTRYPOINT")) + json.loads(one("CMD")) + ["--port", "0"]
    agent = subprocess.Popen(
        host_argv(command), env=container.env, cwd=container.cwd,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert agent.stdout is not None
        first = agent.stdout.readline()  # printed once every model is READY
        if not first.startswith("edgeagent serving tiny 1"):
            agent.kill()
            pytest.fail(first + agent.communicate()[1])
        healthy = container.run(healthcheck_command())
        assert healthy.returncode == 0, healthy.stdout + healthy.stderr
        socket = Path(container.env["RUNTIME_DIRECTORY"]) / "agent.sock"
        assert healthy.stdout == f"ready: {socket}\n"
        if os.geteuid() == 0:  # the agent itself runs as the image's user, never as root
            assert socket.stat().st_uid == pwd.getpwnam(STAND_IN_USER).pw_uid
    finally:
        agent.terminate()
        assert agent.wait(timeout=60) == 0, agent.communicate()[1]
    down = container.run(healthcheck_command())
    assert down.returncode == 1, down.stdout + down.stderr
    assert "not ready" in down.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="preparing directories for another user needs root")
def test_the_entrypoint_gives_root_made_directories_to_the_user_and_keeps_added_groups(
    container: Container,
) -> None:
    """What `docker run -v /run/edgeagent:/run/edgeagent` leaves (root 0755) becomes the
    user's; `--group-add render` (a supplementary group of the container) survives the drop."""
    user = pwd.getpwnam(STAND_IN_USER)
    added = 44  # a group the container was started with, as --group-add gives it
    result = container.run(
        ["setpriv", f"--groups={added}", "--", json.loads(one("ENTRYPOINT"))[0],
         "sh", "-c", "id -u; id -G"]
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    uid, groups = result.stdout.splitlines()
    assert uid == str(user.pw_uid)
    assert str(added) in groups.split() and "0" not in groups.split()
    for name in ("RUNTIME_DIRECTORY", "STATE_DIRECTORY"):
        info = Path(container.env[name]).stat()
        assert (info.st_uid, info.st_gid) == (user.pw_uid, user.pw_gid), name
        assert stat.S_IMODE(info.st_mode) == 0o750, name
    assert "giving" in result.stderr  # it says what it changed
    models = container.volumes["/models"].stat()
    assert models.st_uid == 0  # the models volume (mounted read-only) is left alone


@pytest.mark.skipif(os.geteuid() != 0, reason="preparing directories for another user needs root")
def test_the_entrypoint_takes_other_ids_at_run_time(container: Container) -> None:
    """`docker run -e EDGEAGENT_UID=… -e EDGEAGENT_GID=…` on a host where the image's ids are
    taken: the agent runs with them, owns the directories with them, and keeps no image gid."""
    image_gid = pwd.getpwnam(STAND_IN_USER).pw_gid
    container.env.update(EDGEAGENT_UID="61234", EDGEAGENT_GID="61235")
    result = container.run([json.loads(one("ENTRYPOINT"))[0], "sh", "-c", "id -u; id -g; id -G"])
    assert result.returncode == 0, result.stderr
    uid, gid, groups = result.stdout.splitlines()
    assert (uid, gid) == ("61234", "61235")
    assert str(image_gid) not in groups.split() and "0" not in groups.split()
    for name in ("RUNTIME_DIRECTORY", "STATE_DIRECTORY"):
        info = Path(container.env[name]).stat()
        assert (info.st_uid, info.st_gid) == (61234, 61235), name
    for bad in ("0", "root", "-5", "00"):
        container.env["EDGEAGENT_GID"] = bad
        refused = container.run([json.loads(one("ENTRYPOINT"))[0], "true"])
        assert refused.returncode == 1 and "EDGEAGENT_GID" in refused.stderr, bad


def test_the_entrypoint_started_as_a_user_changes_nothing(tmp_path: Path) -> None:
    """`docker run --user …`: no privilege to give anything away, so it only runs the command."""
    run = tmp_path / "run"
    run.mkdir()
    before = run.stat()
    env = {**os.environ, "RUNTIME_DIRECTORY": str(run), "EDGEAGENT_USER": STAND_IN_USER}
    argv = ["sh", str(ENTRYPOINT_SCRIPT), "id", "-u"]
    uid = os.geteuid()
    if uid == 0:  # as root, be the user: the script must not even try
        uid = pwd.getpwnam(STAND_IN_USER).pw_uid
        argv = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", *argv]
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout, result.stderr) == (0, f"{uid}\n", "")
    after = run.stat()
    assert (after.st_uid, after.st_mode) == (before.st_uid, before.st_mode)


def test_container_mode_of_the_script_installs_no_unit(tmp_path: Path) -> None:
    result = subprocess.run(
        ["bash", str(REPO / "scripts/install-device.sh"), "--container", "--dry-run",
         "--root", str(tmp_path / "r"), "--source", "x.whl", "--extras", "litert"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "x.whl[litert]" in result.stdout
    assert "edgeagent.service" not in result.stdout and "sysusers" not in result.stdout


@pytest.mark.slow
def test_the_image_builds_and_serves_a_package(tmp_path: Path) -> None:
    engine = _engine()
    if engine is None:
        pytest.skip("no working docker or podman here")
    tag = f"edgeagent-test:{uuid.uuid4().hex[:8]}"
    podman = Path(engine).name == "podman"
    # podman's default OCI format has no HEALTHCHECK and drops it; docs/install/container.md
    form = ["--format", "docker"] if podman else []
    subprocess.run(
        [engine, "build", *form, "--build-arg", "EXTRAS=", "-t", tag, str(REPO)],
        check=True, timeout=900,
    )  # fmt: skip
    field = "{{json .HealthCheck}}" if podman else "{{json .Config.Healthcheck}}"
    kept = subprocess.run(
        [engine, "image", "inspect", "--format", field, tag], capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert IMAGE_AGENT in kept.stdout, kept.stdout + kept.stderr
    write_tiny_package(tmp_path / "models" / "tiny")
    (tmp_path / "models").chmod(0o755)
    (tmp_path / "run").mkdir(mode=0o755)  # podman makes no missing bind source: the README's step
    name = tag.replace(":", "-")
    try:
        # As the README runs it: the socket directory bind-mounted from a root-owned 0755 one.
        subprocess.run(
            [engine, "run", "-d", "--name", name, "-v", f"{tmp_path / 'models'}:/models:ro",
             "-v", f"{tmp_path / 'run'}:/run/edgeagent", tag],
            check=True, timeout=120,
        )  # fmt: skip
        logs = subprocess.Popen([engine, "logs", "-f", name], stdout=subprocess.PIPE, text=True)
        assert logs.stdout is not None
        first = logs.stdout.readline()  # printed once every model is READY
        logs.kill()
        assert first.startswith("edgeagent serving tiny 1"), first
        healthy = subprocess.run(
            [engine, "exec", name, *healthcheck_command()], capture_output=True, text=True,
            timeout=60,
        )  # fmt: skip
        assert healthy.returncode == 0, healthy.stderr
        owner = subprocess.run(
            [engine, "exec", name, "stat", "-c", "%U", "/run/edgeagent/agent.sock"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert owner.stdout.strip() == "edgeagent"
    finally:
        subprocess.run([engine, "rm", "-f", name], capture_output=True, timeout=120)
        subprocess.run([engine, "rmi", "-f", tag], capture_output=True, timeout=120)
