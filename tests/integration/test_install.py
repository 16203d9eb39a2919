"""Installing edgeagent as a user would: a wheel built from the checkout, installed by
scripts/install-device.sh into a temporary root, run from outside the checkout.

One install serves every test of the module (building a venv is the slow part); pip reuses its
cache and the machine's wheel indexes, as on a device.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgeagent.api.client import AgentClient
from tests.support.helpers import REPO, write_tiny_package

SCRIPT = REPO / "scripts" / "install-device.sh"
BOARDS = REPO / "tests" / "fixtures" / "boards"

pytestmark = pytest.mark.slow


def _clean_env(home: Path) -> dict[str, str]:
    """The environment of a fresh login: nothing of this checkout or its venv."""
    keep = ("PATH", "LANG", "PIP_CACHE_DIR", "PIP_FIND_LINKS", "PIP_DEFAULT_TIMEOUT", "PIP_CERT")
    env = {k: v for k, v in os.environ.items() if k in keep}
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "/usr/bin:/bin").split(os.pathsep) if ".venv" not in p
    )
    return {
        **env,
        "HOME": str(home),
        "XDG_STATE_HOME": str(home / "state"),
        "XDG_RUNTIME_DIR": str(home / "run"),
        "XDG_CACHE_HOME": str(Path.home() / ".cache"),  # pip's cache, as a device would reuse
    }


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(out), str(REPO)],
        check=True, timeout=300,
    )  # fmt: skip
    (found,) = out.glob("edgeagent-*.whl")
    return found


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A --root install for a Raspberry Pi 5 (fixture board) whose /etc/group has render (of the
    optional groups) and edgeagent, run by a caller whose umask is 000."""
    root = tmp_path_factory.mktemp("root")
    (root / "etc").mkdir()
    (root / "etc" / "group").write_text("root:x:0:\nrender:x:107:\nedgeagent:x:998:\n")
    result = subprocess.run(
        ["bash", "-c", 'umask 000 && exec bash "$@"', "bash",
         str(SCRIPT), "--root", str(root), "--source", str(wheel),
         "--board-root", str(BOARDS / "raspberry-pi-5"), "--allow-ip", "192.0.2.10"],
        capture_output=True, text=True, timeout=600, cwd=root,
        env=_clean_env(tmp_path_factory.mktemp("home")),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return root, result.stdout


def test_the_wheel_carries_profiles_unit_sysusers_openapi_example_and_license(
    wheel: Path,
) -> None:
    import zipfile

    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    for expected in (
        "edgeagent/device_profiles/jetson-orin.toml",
        "edgeagent/device_profiles/generic-x86_64.toml",
        "edgeagent/systemd/edgeagent.service",
        "edgeagent/systemd/edgeagent.sysusers",
        "edgeagent/api/http/openapi.yaml",
        "edgeagent/agent.example.toml",
    ):
        assert expected in names, expected
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)


def test_the_sdist_carries_the_license_and_the_package_data(tmp_path: Path) -> None:
    import tarfile

    subprocess.run(
        [sys.executable, "-c",
         "import sys; from setuptools import build_meta; build_meta.build_sdist(sys.argv[1])",
         str(tmp_path)],
        check=True, timeout=300, cwd=REPO, capture_output=True,
    )  # fmt: skip
    (sdist,) = tmp_path.glob("edgeagent-*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    expected = {"LICENSE", "edgeagent/device_profiles/rk3588.toml",
                "edgeagent/systemd/edgeagent.service", "edgeagent/agent.example.toml"}  # fmt: skip
    assert expected <= names


def test_the_script_wrote_venv_unit_sysusers_config_and_drop_in(installed) -> None:
    root, output = installed
    shipped = REPO / "edgeagent"
    unit = root / "etc/systemd/system/edgeagent.service"
    assert unit.read_text() == (shipped / "systemd/edgeagent.service").read_text()
    assert (root / "usr/lib/sysusers.d/edgeagent.conf").read_text() == (
        shipped / "systemd/edgeagent.sysusers"
    ).read_text()
    assert (root / "etc/edgeagent/agent.toml").read_text() == (
        shipped / "agent.example.toml"
    ).read_text()
    config = (root / "etc/edgeagent/agent.toml").stat()
    assert oct(config.st_mode & 0o777) == "0o640"  # it may hold [server] token
    if os.geteuid() == 0:  # the target's group edgeagent, by its number there
        assert (config.st_uid, config.st_gid) == (0, 998)
    dropin = (root / "etc/systemd/system/edgeagent.service.d/10-install.conf").read_text()
    assert "SupplementaryGroups=render\n" in dropin  # video does not exist in this root
    assert "IPAddressAllow=192.0.2.10\n" in dropin
    assert (root / "opt/edgeagent/README.md").read_text().startswith("# edgeagent")
    assert "board profile: raspberry-pi-5; extras its candidates need: litert" in output
    assert f"config check {root}/etc/edgeagent/agent.toml" in output
    litert = subprocess.run(
        [str(root / "opt/edgeagent/bin/python"), "-c", "import ai_edge_litert"], timeout=120
    )
    assert litert.returncode == 0, "the detected board's extra was not installed"


def test_nothing_it_wrote_is_writable_by_others_whatever_the_callers_umask(installed) -> None:
    """The caller's umask was 000: the script's modes are its own."""
    root, _ = installed
    loose = [
        str(path.relative_to(root))
        for path in [root, *root.rglob("*")]
        if not path.is_symlink() and path.lstat().st_mode & 0o022
    ]
    assert loose == []


def _planted(root: Path, outside: Path) -> None:
    (root / "etc/edgeagent").mkdir(parents=True)
    (root / "etc/edgeagent/agent.toml").symlink_to(outside / "shadow")


def _planted_directory(root: Path, outside: Path) -> None:
    (root / "etc").mkdir(parents=True)
    (root / "etc/systemd").symlink_to(outside)


@pytest.mark.parametrize(
    ("plant", "link"), [(_planted, "etc/edgeagent/agent.toml"), (_planted_directory, "etc/systemd")]
)
def test_a_planted_link_in_the_root_is_refused_before_anything_changes(
    tmp_path: Path, wheel: Path, plant, link: str
) -> None:
    """A link in --root's tree would make the install chmod, chown or write a file outside it
    (with a real wheel, so that nothing but the refusal stops it short of that)."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    outside.mkdir()
    (outside / "shadow").write_text("root:secret\n")
    (outside / "shadow").chmod(0o600)
    plant(root, outside)
    for dry_run in ([], ["--dry-run"]):
        result = subprocess.run(
            ["bash", str(SCRIPT), "--root", str(root), "--source", str(wheel), "--extras", "",
             *dry_run],
            capture_output=True, text=True, timeout=600, env=_clean_env(tmp_path / "home"),
        )  # fmt: skip
        assert result.returncode == 1, result.stdout + result.stderr
        assert f"{root}/{link} is a symbolic link (to {outside}" in result.stderr
        assert "refusing to follow it" in result.stderr
    assert sorted(p.name for p in outside.iterdir()) == ["shadow"]
    assert (outside / "shadow").stat().st_mode & 0o777 == 0o600
    assert (outside / "shadow").read_text() == "root:secret\n"
    assert not (root / "opt").exists()  # refused before the venv


def test_the_installed_agent_works_from_outside_the_checkout(installed, tmp_path: Path) -> None:
    root, _ = installed
    agent = str(root / "opt/edgeagent/bin/edgeagent")
    env = _clean_env(tmp_path)
    (tmp_path / "run").mkdir()

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [agent, *args], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env
        )

    board = cli("profile", "--board")
    assert board.returncode == 0 and board.stdout.startswith("profile generic-"), board.stderr
    check = cli("config", "check")
    assert check.returncode == 0, check.stderr
    package = write_tiny_package(tmp_path / "models" / "tiny")
    # Port 0: TCP off, so parallel test runs cannot collide on 8080; the socket is the default
    # one under $XDG_RUNTIME_DIR.
    daemon = subprocess.Popen(
        [agent, "run", "--models-dir", str(package.parent), "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env,
    )  # fmt: skip
    try:
        assert daemon.stdout is not None
        first = daemon.stdout.readline()  # printed once every model is READY
        assert first.startswith("edgeagent serving tiny 1"), first + daemon.stderr.read()
        client = AgentClient(socket_path=tmp_path / "run" / "edgeagent" / "agent.sock")
        batch = np.zeros((1, 3, 8, 8), dtype=np.float32)
        answer = client.infer("tiny", {"input": batch})
        assert answer.outputs["logits"].shape == (1, 4)
    finally:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(timeout=60) == 0


def test_dry_run_prints_every_step_and_changes_nothing(tmp_path: Path) -> None:
    result = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", "--root", str(tmp_path / "r"), "--source", "x.whl"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    for step in ("-m venv", "pip install", "profile --board", "agent.toml", "edgeagent.service",
                 "sysusers", "10-install.conf", "nothing was changed"):  # fmt: skip
        assert step in result.stdout, step
    assert not (tmp_path / "r").exists()


def test_dry_run_on_the_device_prints_the_user_the_secrets_and_the_start(tmp_path: Path) -> None:
    """No --root: what a board's install would do, down to `enable --now`, changing nothing."""
    before = {p: p.exists() for p in (Path("/opt/edgeagent"), Path("/etc/edgeagent/agent.toml"))}
    result = subprocess.run(
        ["bash", str(SCRIPT), "--dry-run", "--source", "x.whl", "--extras", ""],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    expected = [
        "+ systemd-sysusers /usr/lib/sysusers.d/edgeagent.conf",
        "+ chmod 0640 /etc/edgeagent/agent.toml",
        "+ systemctl daemon-reload",
        "+ systemctl enable --now edgeagent",
        "dry run: nothing was changed",
    ]
    if not before[Path("/etc/edgeagent/agent.toml")]:
        expected.insert(1, "+ write /etc/edgeagent/agent.toml from the package's "
                        "agent.example.toml (mode 0640)")  # fmt: skip
    found = [line for line in lines if line in expected]
    assert found == expected, result.stdout  # each step, in the order it would run
    assert any(line.startswith("+ chown ") and "agent.toml" in line for line in lines)
    assert "token_file" in result.stdout  # the token files it would tighten
    assert {p: p.exists() for p in before} == before


def test_an_unknown_argument_is_exit_2(tmp_path: Path) -> None:
    result = subprocess.run(
        ["bash", str(SCRIPT), "--frobnicate"], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2 and "unknown argument: --frobnicate" in result.stderr


def test_a_rerun_keeps_the_config_and_allows_the_brokers_dns(
    installed, wheel: Path, tmp_path: Path
) -> None:
    """Runs last: it edits the installed root's config, as an operator would before a rerun.

    A broker given by name needs its resolvers allowed; loopback ones already are.
    """
    root, _ = installed
    config = root / "etc/edgeagent/agent.toml"
    config.write_text('[mqtt]\nhost = "localhost"\n')
    (root / "etc/resolv.conf").write_text("nameserver 127.0.0.53\nnameserver 192.0.2.53\n")
    result = subprocess.run(
        ["bash", str(SCRIPT), "--root", str(root), "--source", str(wheel), "--extras", "",
         "--allow-ip", "198.51.100.0/24"],
        capture_output=True, text=True, timeout=600, env=_clean_env(tmp_path),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"keeping existing {config}" in result.stdout
    assert config.read_text() == '[mqtt]\nhost = "localhost"\n'
    dropin = (root / "etc/systemd/system/edgeagent.service.d/10-install.conf").read_text()
    allowed = next(line for line in dropin.splitlines() if line.startswith("IPAddressAllow="))
    assert allowed == "IPAddressAllow=192.0.2.53 198.51.100.0/24"
