"""The agent updates itself (issue 27), with real wheels, venvs, processes, broker and HTTP.

This repository is built as wheels at several versions once per session (a copy of the tree
with ``__version__`` bumped, ``pip wheel --no-deps``; some versions broken on purpose). To keep
the many switches here cheap, each version's venv reads the test environment's dependencies
through ``[updates] agent_extra_site_dirs`` — a directory of links to this .venv's
site-packages minus the editable edgeagent and pip — so the wheelhouses hold only the agent
wheel, and each venv installs it with its *own* pip (``pip install --no-index --find-links``,
dependencies found already installed). tests/integration/test_selfupdate_documented.py runs a
switch and a rollback with nothing borrowed: every dependency wheel in the wheelhouse.

A supervisor that behaves like systemd for the A/B drop-in (``tests.support.supervisor``) runs
``<root>/boot-check`` then ``<root>/current/venv/bin/edgeagent run``; the release reaches the
running agent over MQTT and its wheelhouse over HTTP, as on a device.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from devtools.broker import Broker
from devtools.tiny import write_tiny_package
from devtools.waiting import wait_until
from edgeagent.api.client import AgentClient
from edgeagent.commands.selfupdate import dropin
from edgeagent.fleet.agent_manifest import this_platform
from edgeagent.fleet.topics import DeviceTopics
from edgeagent.hub.agent_release import sign_agent_release
from edgeagent.hub.keys import keygen
from edgeagent.hub.publish import publish
from edgeagent.hub.serials import ReleaseSerials
from edgeagent.selfupdate.layout import MARKER, Layout
from edgeagent.selfupdate.state import PendingSwitch, SwitchState
from tests.support.helpers import REPO
from tests.support.supervisor import Supervisor

pytestmark = pytest.mark.timeout(900)  # a few installs each (INSTALL_S), on a busy box

PYTHON = Path(sys.executable)
DEVICE = "dev-ab"
BASE = "0.1.0"
# The bound on a wait that spans an install (a venv with its pip, pip, the new version's checks:
# about 30 s on a quiet 2-core box, several times that beside other jobs). Only a bound: every
# wait ends as soon as its condition holds.
INSTALL_S = 300.0


Patch = tuple[str, str, str]  # file, text found there once ("": the end), text put instead

_HEALTH_CHECK = "        try:\n            model = self.registry.get(name)\n"
_FAILS_HEALTH_CHECK: Patch = (
    "edgeagent/updates/updater.py",
    _HEALTH_CHECK,
    '        raise InstallFailed("health_check_failed", "broken on purpose")\n' + _HEALTH_CHECK,
)
# state format 2, as a developer would add it: one migration, and the code that reads it
_FORMAT_2: list[Patch] = [
    (
        "edgeagent/selfupdate/migrations.py",
        "",
        """

def _keys_in_a_directory(state_dir: Path) -> None:
    keys = state_dir / "keys"
    keys.mkdir(mode=0o700, exist_ok=True)
    for name in ("device-key.pem", "device-key.pub"):
        if (state_dir / name).exists():
            (state_dir / name).replace(keys / name)


MIGRATIONS = (
    *MIGRATIONS,
    Migration(
        2, "the device key pair moves into keys/", ("device-key.pem", "device-key.pub", "keys"),
        _keys_in_a_directory,
    ),
)
""",
    ),
    ("edgeagent/models/device_key.py", '= "device-key.pem"', '= "keys/device-key.pem"'),
]
_PATCHES: dict[str, list[Patch]] = {
    # crashes when `edgeagent run` imports the daemon; `config check` still passes
    "0.3.0": [("edgeagent/daemon.py", "", '\nraise ImportError("0.3.0 broken on purpose")\n')],
    # blocks its event loop after loading, before it tells the service manager READY
    "0.4.0": [
        (
            "edgeagent/daemon.py",
            "        self.notifier.ready(summary)\n",
            "        time.sleep(3600)  # hangs before READY on purpose\n"
            "        self.notifier.ready(summary)\n",
        )
    ],
    # READY, but its confirmation health check fails
    "0.5.0": [_FAILS_HEALTH_CHECK],
    # cannot read the live config: must be refused before the switch
    "0.6.0": [
        (
            "edgeagent/commands/config.py",
            "def run_check(args: argparse.Namespace) -> int:\n",
            "def run_check(args: argparse.Namespace) -> int:\n"
            '    print("0.6.0 cannot read this config", file=sys.stderr)\n    return 2\n',
        )
    ],
    "0.7.0": _FORMAT_2,  # migrates the state to format 2, and serves on it
    "0.8.0": [*_FORMAT_2, _FAILS_HEALTH_CHECK],  # migrates, then fails its health check
    # the version bumped in pyproject only, as when it was written in two places
    "0.9.0": [
        ("pyproject.toml", 'dynamic = ["version"]', 'version = "0.9.0"'),
        ("pyproject.toml", 'version = { attr = "edgeagent.__version__" }\n', ""),
        ("edgeagent/__init__.py", '__version__ = "0.9.0"', '__version__ = "0.2.0"'),
    ],
}


def _break(tree: Path, version: str) -> None:
    """Make the tree of ``version`` what ``_PATCHES`` says (nothing: a good version)."""
    for relative, old, new in _PATCHES.get(version, []):
        path = tree / relative
        text = path.read_text()
        assert not old or text.count(old) == 1, (relative, old)
        path.write_text(text.replace(old, new) if old else text + new)


def _build_wheel(version: str, work: Path) -> Path:
    """``pip wheel`` of this repository at ``version``, into its own wheel directory."""
    tree = work / f"src-{version}"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "edgeagent", tree / "edgeagent", ignore=ignore)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, tree / name)
    init = tree / "edgeagent" / "__init__.py"  # the one place the version is written
    text, count = re.subn(
        r'(?m)^__version__ = "[^"]+"', f'__version__ = "{version}"', init.read_text(), count=1
    )
    assert count == 1
    init.write_text(text)
    _break(tree, version)
    wheels = work / f"wheels-{version}"
    subprocess.run(
        [PYTHON, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", ".", "-w",
         wheels],
        cwd=tree, check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    shutil.rmtree(tree)
    return wheels


@pytest.fixture(scope="session")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The agent's wheel directory per version, built once per session."""
    work = tmp_path_factory.mktemp("agent-wheels")
    versions = (BASE, "0.2.0", "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "0.9.0")
    return {v: _build_wheel(v, work) for v in versions}


@pytest.fixture(scope="session")
def site_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This venv's site-packages as links, minus the editable edgeagent and pip (see module
    doc): each version installs the next with the pip of its own venv."""
    site = next(Path(p) for p in sys.path if p.endswith("site-packages"))
    links = tmp_path_factory.mktemp("deps")
    left_out = ("edgeagent", "__editable__", "_virtualenv", "pip")
    for entry in site.iterdir():
        if entry.name.startswith(left_out) or entry.suffix == ".pth":
            continue
        (links / entry.name).symlink_to(entry)
    return links


class Device:
    """An A/B root, its config, the hub's keys and artifact site, and the supervisor."""

    def __init__(
        self, tmp: Path, broker: Broker, site_dir: Path | None, wheels: dict[str, Path]
    ) -> None:
        self.tmp, self.broker, self.wheels = tmp, broker, wheels
        self.root = tmp / "opt"
        self.hub = tmp / "hub"
        keygen(self.hub, agent_keys=1)
        self.serials = ReleaseSerials(self.hub / "serials.json")
        self.artifacts = tmp / "artifacts"
        self.artifacts.mkdir()
        handler = functools.partial(SimpleHTTPRequestHandler, directory=str(self.artifacts))
        self.http = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        self.socket = tmp / "run" / "agent.sock"
        write_tiny_package(tmp / "models" / "tiny")
        self.config = tmp / "agent.toml"
        self.site_dir = site_dir
        self.supervisor: Supervisor | None = None

    def write_config(self, **agent: object) -> None:
        settings = self.broker.settings()
        keys = {
            "agent_root": str(self.root),
            "agent_config_file": str(self.config),
            "agent_extra_site_dirs": [str(self.site_dir)] if self.site_dir else [],
            "agent_max_boots": 2,
            "agent_commit_deadline_s": 90.0,
            **agent,
        }
        updates = "\n".join(f"{k} = {json.dumps(v)}" for k, v in keys.items())
        self.config.write_text(
            f'[agent]\nstate_dir = "{self.tmp / "state"}"\nmodels_dir = "{self.tmp / "models"}"\n'
            f'device_id = "{DEVICE}"\n'
            f'[server]\nunix_socket = "{self.socket}"\ntcp_port = 0\n'
            f'[updates]\nenabled = true\ngroup = "lab"\ntrust_file = "{self.hub / "trust.json"}"\n'
            f"{updates}\n"
            f'[mqtt]\nhost = "127.0.0.1"\nport = {settings.port}\nreconnect_min_s = 0.2\n'
            "reconnect_max_s = 1.0\n"
        )

    def init(self) -> str:
        """``agent-update init`` as the docs say (with the borrowed dependencies, if any);
        what it printed."""
        extra = ["--extra-site-dir", str(self.site_dir)] if self.site_dir else []
        done = subprocess.run(
            [PYTHON, "-m", "edgeagent.cli", "agent-update", "init", "--root", self.root,
             "--wheelhouse", self.wheels[BASE], *extra],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "ExecStartPre=" in done.stdout
        return done.stdout

    def run(self, start_timeout_s: float = 30.0, extra_env=None) -> Supervisor:
        self.supervisor = Supervisor(
            self.root,
            ["run", "--config", str(self.config)],
            log=self.tmp / "supervisor.log",
            start_timeout_s=start_timeout_s,
            extra_env=extra_env,
        ).start()
        self.wait_serving(BASE)
        return self.supervisor

    def sign(self, version: str, key: str = "agent") -> bytes:
        url = f"http://127.0.0.1:{self.http.server_address[1]}"
        path = sign_agent_release(
            {this_platform(): self.wheels[version]},
            key_paths=[self.hub / f"{key}.key"],
            base_url=url,
            out_dir=self.artifacts,
            serials=self.serials,
        )
        return path.read_bytes()

    def send(self, envelope: bytes) -> None:
        topic = DeviceTopics(self.broker.settings().topic_prefix, DEVICE).release
        asyncio.run(publish(self.broker.settings(), [topic], envelope))

    def status(self) -> dict:
        return AgentClient(socket_path=self.socket).status()

    def agent_version(self) -> str | None:
        try:
            return self.status()["agent"]["version"]
        except Exception:  # between two starts: nothing listens
            return None

    def wait_serving(self, version: str, timeout: float = INSTALL_S) -> None:
        """A READY start of ``version`` answers its API, with no switch left pending."""

        def serving() -> bool:
            start = self.supervisor.serving() if self.supervisor else None
            return (
                start is not None
                and start.version == version
                and not (self.root / "pending.json").exists()
                and self.agent_version() == version
            )

        try:
            wait_until(serving, timeout=timeout)
        except AssertionError as exc:
            log = (self.tmp / "supervisor.log").read_text()[-6000:]
            starts = self.supervisor.starts if self.supervisor else []
            raise AssertionError(f"{version} not serving; starts {starts}\n{log}") from exc

    def outcomes(self) -> list[dict]:
        return self.status()["updates"].get("history", [])

    def last_agent_outcome(self) -> dict | None:
        found = [o for o in self.outcomes() if o.get("model") == "edgeagent"]
        return found[-1] if found else None

    def stop(self) -> None:
        if self.supervisor is not None:
            self.supervisor.stop()
        self.http.shutdown()


@pytest.fixture
def device(tmp_path: Path, broker: Broker, site_dir: Path, wheels) -> Iterator[Device]:
    instance = Device(tmp_path, broker, site_dir, wheels)
    instance.write_config()
    instance.init()
    yield instance
    instance.stop()


def committed(device: Device) -> dict:
    return json.loads((device.root / "committed.json").read_text())


def test_an_agent_release_switches_versions_commits_and_reports(device: Device):
    device.run()
    device.send(device.sign("0.2.0"))
    device.wait_serving("0.2.0")
    assert committed(device)["version"] == "0.2.0" and committed(device)["serial"] == 1
    wait_until(lambda: (device.last_agent_outcome() or {}).get("code") == "committed")
    outcome = device.last_agent_outcome()
    assert outcome["result"] == "succeeded" and outcome["version"] == "0.2.0"
    assert Path(device.root / "previous").resolve().name == BASE  # the way back is kept
    # the state directory is shared, not copied: the model store and trust file are the same
    assert device.status()["updates"]["trust_version"] == 1


@pytest.mark.parametrize(
    ("version", "code", "max_boots", "start_timeout_s"),
    [
        ("0.3.0", "no_commit", 2, 30.0),  # crashes at import: two starts, then rolled back
        ("0.4.0", "no_commit", 1, 10.0),  # hangs before READY: killed at the start timeout
        ("0.5.0", "health_check_failed", 2, 30.0),  # READY, fails its own health check
    ],
)
def test_a_broken_agent_rolls_back_by_itself(device, version, code, max_boots, start_timeout_s):
    device.write_config(agent_max_boots=max_boots)
    supervisor = device.run(start_timeout_s=start_timeout_s)
    device.send(device.sign(version))
    wait_until(lambda: any(s.version == version for s in supervisor.starts), timeout=INSTALL_S)
    device.wait_serving(BASE, timeout=INSTALL_S)
    wait_until(lambda: (device.last_agent_outcome() or {}).get("version") == version)
    outcome = device.last_agent_outcome()
    assert outcome["result"] == "failed" and outcome["code"] == code, outcome
    assert committed(device)["bad"] == [version]
    tried = [s for s in supervisor.starts if s.version == version]
    assert len(tried) == (max_boots if code == "no_commit" else 1)
    assert not any(s.ready for s in tried) or code == "health_check_failed"
    # sent again (a retained copy on every reconnect) it is refused, as an event only
    device.send(device.sign(version))
    log = device.tmp / "supervisor.log"
    wait_until(lambda: f"edgeagent {version} refused: known_bad" in log.read_text())
    assert device.supervisor.serving() is supervisor.starts[-1]  # nothing restarted


def test_a_version_that_cannot_read_the_config_is_refused_before_the_switch(device: Device):
    supervisor = device.run()
    device.send(device.sign("0.6.0"))
    wait_until(
        lambda: (device.last_agent_outcome() or {}).get("code") == "config_refused", INSTALL_S
    )
    assert "cannot read this config" in device.last_agent_outcome()["message"]
    assert device.agent_version() == BASE and len(supervisor.starts) == 1
    assert not (device.root / "versions" / "0.6.0").exists()


@pytest.mark.parametrize(
    ("step", "start", "final"),
    [
        ("agent_prepared", 1, BASE),  # installed, nothing recorded: the old one stays
        ("agent_pending", 1, "0.2.0"),  # recorded, links not moved: rolled forward
        ("agent_switched_previous", 1, "0.2.0"),  # half the links moved
        ("agent_confirming", 2, "0.2.0"),  # the new one died before its check: tries again
        ("agent_committing", 2, "0.2.0"),  # committed record, pending left: tidied
    ],
)
def test_sigkill_at_each_step_of_the_switch_recovers(device: Device, step, start, final):
    device.run(extra_env={start: {"EDGEAGENT_UPDATE_KILL_AT": step}})
    device.send(device.sign("0.2.0"))
    wait_until(lambda: len(device.supervisor.starts) > start, timeout=INSTALL_S)
    assert device.supervisor.starts[start - 1].returncode == -9  # it did die there
    device.wait_serving(final)
    record = json.loads((device.root / "committed.json").read_text()) if final != BASE else {}
    assert record.get("version") == (None if final == BASE else final)
    assert Path(device.root / "current").resolve().name == final


def test_a_version_whose_code_says_another_version_is_refused_and_blocks_nothing(
    device: Device, monkeypatch: pytest.MonkeyPatch
):
    """0.9.0's wheel holds code that says 0.2.0 (signed by a hub that did not check it): the
    device installs it, finds it would never confirm itself, refuses it — nothing switched —
    and takes the next release."""
    supervisor = device.run()
    monkeypatch.setattr("edgeagent.hub.agent_release.code_version", lambda directory, v: v)
    device.send(device.sign("0.9.0"))
    wait_until(lambda: (device.last_agent_outcome() or {}).get("version") == "0.9.0", INSTALL_S)
    outcome = device.last_agent_outcome()
    assert (outcome["result"], outcome["code"]) == ("refused", "version_mismatch"), outcome
    assert "__version__ is '0.2.0'" in outcome["message"]
    assert len(supervisor.starts) == 1 and not (device.root / "versions" / "0.9.0").exists()
    device.send(device.sign("0.2.0"))
    device.wait_serving("0.2.0")
    wait_until(lambda: (device.last_agent_outcome() or {}).get("code") == "committed")


def _declared(state: Path) -> dict:
    return json.loads((state / "state-format.json").read_text())


def test_a_state_format_change_migrates_forwards_and_a_rollback_restores_it(device: Device):
    """0.8.0 migrates the state to format 2, then fails its check: 0.1.0 serves again on the
    state it knows; 0.7.0 migrates and commits; then 0.2.0, which reads format 1 only, is
    refused before the switch."""
    supervisor = device.run()
    state, snapshot = device.tmp / "state", device.root / "state-snapshot"
    key = device.status()["device_key"]["public_key"]
    assert _declared(state) == {"format": 1, "written_by": BASE}
    device.send(device.sign("0.8.0"))
    wait_until(lambda: any(s.version == "0.8.0" for s in supervisor.starts), timeout=INSTALL_S)
    device.wait_serving(BASE)
    assert "migrated to format 2" in (device.tmp / "supervisor.log").read_text()
    wait_until(lambda: (device.last_agent_outcome() or {}).get("version") == "0.8.0")
    outcome = device.last_agent_outcome()
    assert outcome["code"] == "health_check_failed", outcome
    assert "state restored to format 1" in outcome["message"]
    assert _declared(state) == {"format": 1, "written_by": BASE} and not snapshot.exists()
    assert (state / "device-key.pem").is_file() and not (state / "keys").exists()
    assert device.status()["device_key"]["public_key"] == key  # its key, not a new one

    device.send(device.sign("0.7.0"))
    device.wait_serving("0.7.0")
    assert _declared(state) == {"format": 2, "written_by": "0.7.0"} and not snapshot.exists()
    assert (state / "keys" / "device-key.pem").is_file() and not (state / "device-key.pem").exists()
    assert device.status()["device_key"]["public_key"] == key
    wait_until(lambda: (device.last_agent_outcome() or {}).get("code") == "committed")

    starts = len(supervisor.starts)
    device.send(device.sign("0.2.0"))  # a newer serial, but an older state format
    wait_until(
        lambda: (device.last_agent_outcome() or {}).get("code") == "state_refused", INSTALL_S
    )
    assert "reads formats up to 1" in device.last_agent_outcome()["message"]
    assert len(supervisor.starts) == starts and device.agent_version() == "0.7.0"
    assert not (device.root / "versions" / "0.2.0").exists()


# --- the shipped unit under a real systemd ---------------------------------------------------

_SYSTEMD = next((p for p in ("/lib/systemd/systemd", "/usr/lib/systemd/systemd") if
                 Path(p).exists()), None)  # fmt: skip
# The [Service] keys of systemd/edgeagent.service that decide starts and restarts; the rest is
# hardening and device access, which a user manager cannot apply.
_START_KEYS = ("Type", "NotifyAccess", "ExecStartPre", "ExecStart", "Restart", "RestartSec",
               "RestartPreventExitStatus", "TimeoutStartSec", "KillMode",
               "TimeoutStopSec")  # fmt: skip


def _start_logic(unit: str) -> str:
    lines = [line for line in unit.splitlines() if line.split("=", 1)[0] in _START_KEYS]
    return "[Service]\n" + "\n".join(lines) + "\n"


class UserSystemd:
    """``systemd --user`` in a private mount namespace: it starts only where
    /run/systemd/system exists (a container's init makes none), so a tmpfs over /run in that
    namespace holds one; its runtime and unit directories are under ``tmp``."""

    def __init__(self, tmp: Path) -> None:
        self.env = {
            **os.environ,
            "XDG_RUNTIME_DIR": str(tmp / "xdg-run"),
            "XDG_CONFIG_HOME": str(tmp / "xdg-config"),
            "HOME": str(tmp),
        }
        (tmp / "xdg-run").mkdir(mode=0o700)
        self.units = tmp / "xdg-config" / "systemd" / "user"
        self.units.mkdir(parents=True)
        script = f"mount -t tmpfs tmpfs /run && mkdir -p /run/systemd/system && exec {_SYSTEMD}"
        self.process = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", script + " --user"],
            env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        # (is-system-running answers "offline" in a container: it cannot stat /proc/1/root)
        wait_until(lambda: self.process.poll() is not None or self.manager("SystemState")
                   in ("running", "degraded"), timeout=30)  # fmt: skip
        if self.process.poll() is not None:
            pytest.skip(f"systemd --user exited {self.process.returncode} in a mount namespace")

    def manager(self, prop: str) -> str:
        return self.ctl("show", "-p", prop, "--value").stdout.strip()

    def ctl(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["systemctl", "--user", *args], env=self.env, capture_output=True,
                              text=True, timeout=30, check=False)  # fmt: skip

    def show(self, unit: str, prop: str) -> str:
        return self.ctl("show", unit, "-p", prop, "--value").stdout.strip()

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()


@pytest.fixture
def user_systemd(tmp_path: Path) -> Iterator[UserSystemd]:
    if _SYSTEMD is None or shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs systemd, unshare and root (a private mount namespace)")
    manager = UserSystemd(tmp_path)
    yield manager
    manager.close()


def _fake_version(layout: Layout, version: str, agent: str) -> None:
    """A version directory whose ``python`` is this interpreter (its boot check is this
    checkout's) and whose ``edgeagent`` is ``agent``: the unit's logic is under test here, not
    the agent (the tests above run real versions)."""
    bin_dir = layout.venv(version) / "bin"
    bin_dir.mkdir(parents=True)
    for name, text in (("python", f'#!/bin/sh\nexec {PYTHON} "$@"\n'), ("edgeagent", agent)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (layout.version_dir(version) / MARKER).write_text("{}")


_SERVES = f"""#!{PYTHON}
import os, signal, socket
address = os.environ["NOTIFY_SOCKET"]
socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM).sendto(
    b"READY=1", "\\0" + address[1:] if address.startswith("@") else address)
signal.pause()
"""


def test_the_shipped_unit_under_systemd_rolls_back_a_version_that_exits_at_start(
    tmp_path: Path, user_systemd: UserSystemd
):
    """Real systemd runs the shipped unit's start logic with the A/B drop-in: a new version
    that exits 2 at start (what a config or state refusal exits with) is restarted, counted by
    the ExecStartPre boot check and rolled back; the old version becomes active."""
    layout, state = Layout(tmp_path / "opt"), SwitchState(tmp_path / "opt")
    _fake_version(layout, BASE, _SERVES)
    _fake_version(layout, "0.2.0", "#!/bin/sh\necho 'cannot start' >&2\nexit 2\n")
    layout.adopt(BASE)
    state.write_pending(PendingSwitch(BASE, "0.2.0", 1, "d", time.time() + 600, 2))
    layout.switch("0.2.0")
    unit = (REPO / "systemd" / "edgeagent.service").read_text()
    (user_systemd.units / "edgeagent.service").write_text(_start_logic(unit))
    dropins = user_systemd.units / "edgeagent.service.d"
    dropins.mkdir()
    (dropins / "10-ab.conf").write_text(dropin(layout.root))
    (dropins / "20-test.conf").write_text("[Service]\nRestartSec=100ms\n")  # not 5 s a restart
    assert user_systemd.ctl("daemon-reload").returncode == 0
    user_systemd.ctl("start", "--no-block", "edgeagent.service")
    settled = ("active", "failed", "inactive")  # inactive: stopped for good, no restart queued
    wait_until(lambda: user_systemd.show("edgeagent.service", "ActiveState") in settled and
               user_systemd.show("edgeagent.service", "Job") == "", 60)  # fmt: skip
    status = user_systemd.ctl("status", "--no-pager", "edgeagent.service").stdout
    assert user_systemd.show("edgeagent.service", "ActiveState") == "active", status
    assert layout.current() == BASE and state.pending() is None
    assert state.record().bad == ["0.2.0"] and state.take_outcome()["code"] == "no_commit"
    assert user_systemd.show("edgeagent.service", "NRestarts") == "2"  # two tries, then back
    assert user_systemd.show("edgeagent.service", "SubState") == "running"
