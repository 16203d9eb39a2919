"""The state directory's declared format, its forward migrations, and the snapshot a rollback
restores (issue 27), on real files; the whole switch killed at each of its steps.

``FORMAT_2`` is a format change as a developer would write one: a rewritten file, a file moved
into a new directory. The crash tests run the switch's code — the old version's ``apply``, the
boot check, the new version's state preparation, confirmation and commit — as one process per
start; the start under test is a forked child that SIGKILLs itself at the named step (no
cleanup runs, as after a power cut), then starts follow until nothing is on trial, and the
device must be on one consistent version with the state in that version's format.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from edgeagent.cli import main as cli
from edgeagent.fleet.agent_manifest import this_platform
from edgeagent.fleet.manifest import DeviceIdentity
from edgeagent.fleet.trust import TrustStore
from edgeagent.fsutil import write_json_atomic
from edgeagent.hub.agent_release import sign_agent_release
from edgeagent.hub.keys import keygen
from edgeagent.hub.serials import ReleaseSerials
from edgeagent.selfupdate import service, snapshot
from edgeagent.selfupdate.boot import boot_check
from edgeagent.selfupdate.install import InstallSettings
from edgeagent.selfupdate.layout import MARKER, Layout
from edgeagent.selfupdate.migrations import MIGRATIONS, Migration
from edgeagent.selfupdate.state import PendingSwitch, SwitchState
from edgeagent.selfupdate.stateformat import (
    FORMAT_FILE,
    StateFormatError,
    plan,
    prepare_state,
    read_declared,
)

OLD, NEW = "0.1.0", "0.2.0"
_kill_at: str | None = None  # set in a forked child: the step it dies at


def _checkpoint(name: str) -> None:
    if name == _kill_at:
        os.kill(os.getpid(), signal.SIGKILL)


def _to_format_2(state_dir: Path) -> None:
    """Format 2 (test): floors.json wraps its table; the device key moves into keys/."""
    floors = state_dir / "store" / "floors.json"
    if floors.exists():
        write_json_atomic(floors, {"floors": json.loads(floors.read_text())})
    _checkpoint("agent_migrating")  # half-way: a kill here must not leave floors wrapped twice
    keys = state_dir / "keys"
    keys.mkdir(mode=0o700, exist_ok=True)
    if (state_dir / "device-key.pem").exists():
        os.replace(state_dir / "device-key.pem", keys / "device-key.pem")


FORMAT_2 = (
    *MIGRATIONS,
    Migration(
        2, "floors wrapped, key in keys/", ("store/floors.json", "device-key.pem", "keys"),
        _to_format_2,
    ),
)  # fmt: skip
FORMATS = {OLD: MIGRATIONS, NEW: FORMAT_2}
ORIGINAL = {"store/floors.json": b'{"tiny": "1"}', "device-key.pem": b"PRIVATE KEY\n"}


def _state(tmp: Path) -> Path:
    """A state directory in format 1 as OLD left it."""
    state = tmp / "state"
    for path, data in ORIGINAL.items():
        (state / path).parent.mkdir(parents=True, exist_ok=True)
        (state / path).write_bytes(data)
    (state / "device-key.pem").chmod(0o600)
    prepare_state(state, None, version=OLD)
    return state


def _in_old_format(state: Path) -> None:
    assert read_declared(state).format == 1 and read_declared(state).written_by == OLD
    for path, data in ORIGINAL.items():
        assert (state / path).read_bytes() == data, path
    assert (state / "device-key.pem").stat().st_mode & 0o777 == 0o600
    assert not (state / "keys").exists()


def _in_new_format(state: Path) -> None:
    assert read_declared(state).format == 2 and read_declared(state).written_by == NEW
    assert json.loads((state / "store" / "floors.json").read_text()) == {"floors": {"tiny": "1"}}
    assert (state / "keys" / "device-key.pem").read_bytes() == ORIGINAL["device-key.pem"]
    assert not (state / "device-key.pem").exists()


# --- the format file and the registry -------------------------------------------------------


def test_the_registry_counts_formats_from_one_and_names_relative_paths():
    assert [m.format for m in MIGRATIONS] == list(range(1, len(MIGRATIONS) + 1))
    for migration in MIGRATIONS:
        assert all(
            not Path(p).is_absolute() and ".." not in Path(p).parts for p in migration.touches
        )


def test_a_fresh_or_undeclared_state_directory_is_declared_at_start(tmp_path: Path):
    assert "migrates it to format 1" in prepare_state(tmp_path / "state", None)
    assert read_declared(tmp_path / "state").format == MIGRATIONS[-1].format
    assert "reads it as it is" in prepare_state(tmp_path / "state", None)


def test_without_a_switch_on_trial_a_migration_runs_in_place(tmp_path: Path):
    state = _state(tmp_path)
    assert "migrates it to format 2" in prepare_state(state, None, version=NEW, migrations=FORMAT_2)
    _in_new_format(state)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"format": 9, "written_by": "0.9.0"}', "is in state format 9 (written by agent 0.9.0)"),
        ("{not json", "unreadable"),
        ('{"format": "2"}', "'format' must be an integer >= 1"),
    ],
)
def test_a_state_format_it_cannot_read_is_refused_by_check_state(
    tmp_path, capsys, content, message
):
    (tmp_path / FORMAT_FILE).write_text(content)
    with pytest.raises(StateFormatError) as refused:
        plan(tmp_path)
    assert message in str(refused.value) and refused.value.code == "state_refused"
    assert cli(["agent-update", "check-state", "--state-dir", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err


def test_check_state_reads_the_state_dir_the_config_names(tmp_path: Path, capsys):
    config = tmp_path / "agent.toml"
    config.write_text(f'[agent]\nstate_dir = "{_state(tmp_path)}"\n')
    assert cli(["agent-update", "check-state", "--config", str(config)]) == 0
    assert f"state format 1 (written by {OLD})" in capsys.readouterr().out


# --- on trial: snapshot, migrate, restore ---------------------------------------------------


@dataclass
class Device:
    """An A/B root with OLD installed and current, its state directory, and a release of NEW."""

    root: Path
    state: Path
    envelope: bytes
    trust: Path
    healthy: bool = True
    outcomes: list[dict] = field(default_factory=list)


def _install(layout: Layout, version: str) -> None:
    layout.venv(version).mkdir(parents=True)
    (layout.version_dir(version) / MARKER).write_text("{}")


def _on_trial(tmp: Path) -> tuple[Layout, SwitchState, PendingSwitch]:
    """NEW switched to and on trial (its first start), as the old version leaves it."""
    layout, state = Layout(tmp / "opt"), SwitchState(tmp / "opt")
    for version in (OLD, NEW):
        _install(layout, version)
    layout.adopt(OLD)
    pending = PendingSwitch(OLD, NEW, 3, "d", 4e9, 3, boots=1)
    state.write_pending(pending)
    layout.switch(NEW)
    return layout, state, pending


def test_on_trial_the_migrated_paths_are_saved_and_a_rollback_restores_them(tmp_path: Path):
    layout, switch, pending = _on_trial(tmp_path)
    state = _state(tmp_path)
    said = prepare_state(state, layout.root, version=NEW, migrations=FORMAT_2)
    assert "saved for a rollback" in said
    _in_new_format(state)
    saved = snapshot.load(layout.root)
    assert saved is not None and saved.belongs_to(pending) and saved.format == 1
    assert set(saved.saved) == {"store/floors.json", "device-key.pem", FORMAT_FILE}
    assert saved.absent == ("keys",)
    assert (layout.root / snapshot.SNAPSHOT_DIR).stat().st_mode & 0o777 == 0o700
    switch.write_pending(pending.failed("health_check_failed", "tiny is wrong"))
    assert "state restored to format 1" in boot_check(layout.root)
    _in_old_format(state)
    assert layout.current() == OLD and snapshot.load(layout.root) is None
    assert "state restored to format 1" in switch.take_outcome()["message"]
    assert "reads it as it is" in prepare_state(state, layout.root, version=OLD)


def test_a_state_from_before_formats_is_refused_on_trial_when_it_would_need_a_snapshot(
    tmp_path: Path,
):
    layout, switch, _ = _on_trial(tmp_path)
    state = tmp_path / "state"
    (state / "store").mkdir(parents=True)
    (state / "store" / "floors.json").write_bytes(ORIGINAL["store/floors.json"])
    with pytest.raises(StateFormatError, match="predates state formats"):
        prepare_state(state, layout.root, version=NEW, migrations=FORMAT_2)
    assert switch.pending().verdict.startswith("state_refused: ")  # the boot check rolls back
    assert not (state / FORMAT_FILE).exists() and snapshot.load(layout.root) is None
    assert "rolled back" in boot_check(layout.root) and layout.current() == OLD


def test_a_snapshot_of_another_switch_is_stale(tmp_path: Path):
    layout, _, pending = _on_trial(tmp_path)
    state = _state(tmp_path)
    other = PendingSwitch(OLD, "0.1.5", 2, "d", 4e9, 3)
    snapshot.take(layout.root, other, state, 1, ("store/floors.json",))
    (state / "store" / "floors.json").write_text('{"tiny": "0"}')  # not this switch's business
    prepare_state(state, layout.root, version=NEW, migrations=FORMAT_2)
    assert snapshot.load(layout.root).belongs_to(pending)
    assert json.loads((state / "store" / "floors.json").read_text()) == {"floors": {"tiny": "0"}}


# --- SIGKILL at every step of the switch ----------------------------------------------------


class _Reporter:
    def __init__(self, device: Device) -> None:
        self.device = device

    def outcome(self, release, result, code, message, *, persist=True) -> dict:
        record = {"version": release["version"], "result": result, "code": code, "message": message}
        self.device.outcomes.append(record)
        return record

    def progress(self, release, step, **detail) -> None:
        pass


class _Updates(service.AgentUpdates):
    def _prepare(self, version: str, archive: Path) -> None:
        _install(self.layout, version)  # what install_version leaves, without venv and pip


class _Unhealthy(Exception):
    code = "health_check_failed"


async def _run(device: Device, version: str, deliver: bool) -> None:
    async def download(artifact, release) -> Path:
        archive = device.root.parent / "wheelhouse.tar"
        archive.write_bytes(b"wheels")
        return archive

    async def check(name: str) -> None:
        if not device.healthy:
            raise _Unhealthy(f"{name}: wrong class")

    settings = service.SwitchSettings(
        root=device.root,
        config_file=device.root / "agent.toml",
        keep_versions=3,
        max_boots=3,
        commit_deadline_s=600.0,
        install=InstallSettings(timeout_s=60.0, max_unpacked_bytes=1 << 20),
        max_artifact_bytes=1 << 20,
        clock_skew_s=300.0,
    )
    updates = _Updates(
        settings,
        device=DeviceIdentity("dev-1", "generic-x86_64", "", agent_version=version),
        reporter=_Reporter(device),
        download=download,
        served_models=lambda: ["tiny"],
        check_model=check,
        checkpoint=_checkpoint,
        restart=lambda: None,
    )
    updates.start()
    if updates.confirming is not None:
        await updates.confirming
    elif deliver:
        trust = TrustStore.load(device.root.parent / "trust" / "trust.json", seed=device.trust)
        await updates.apply(device.envelope, trust)


def start(device: Device, deliver: bool = False) -> None:
    """One start: the boot check, then the version ``current`` names prepares its state, reports
    what the boot check left, confirms a switch on trial or (``deliver``) takes the release."""
    boot_check(device.root, checkpoint=_checkpoint)
    version = Layout(device.root).current()
    assert version is not None
    kept, service.__version__ = service.__version__, version
    try:
        prepare_state(
            device.state, device.root, version=version, migrations=FORMATS[version],
            checkpoint=_checkpoint,
        )  # fmt: skip
        asyncio.run(_run(device, version, deliver))
    finally:
        service.__version__ = kept


@pytest.fixture(scope="module")
def release(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, Path]:
    hub = tmp_path_factory.mktemp("hub")
    keygen(hub, agent_keys=1)
    wheels = hub / "wheels"
    wheels.mkdir()
    with zipfile.ZipFile(wheels / f"edgeagent-{NEW}-py3-none-any.whl", "w") as wheel:
        wheel.writestr("edgeagent/__init__.py", f'__version__ = "{NEW}"\n')  # hub sign reads it
    path = sign_agent_release(
        {this_platform(): wheels},
        key_paths=[hub / "agent.key"],
        base_url="http://hub.example:8000",
        out_dir=hub / "out",
        serials=ReleaseSerials(hub / "serials.json"),
    )
    return path.read_bytes(), hub / "trust.json"


def _killed_at(step: str, device: Device) -> None:
    """Run starts (the first takes the release) in a child until it SIGKILLs itself at ``step``."""
    global _kill_at
    child = os.fork()
    if child == 0:  # pragma: no cover - the child
        status = 3  # never reached the step
        try:
            _kill_at = step
            for number in range(4):
                start(device, deliver=number == 0)
        except BaseException:
            import traceback

            traceback.print_exc()
            status = 4
        os._exit(status)
    _, status = os.waitpid(child, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, (step, status)


@pytest.mark.parametrize(
    ("step", "healthy", "final"),
    [
        ("agent_downloaded", True, OLD),  # nothing recorded: the old version stays
        ("agent_prepared", True, OLD),
        ("agent_pending", True, NEW),  # recorded: the boot check rolls it forward
        ("agent_switched_previous", True, NEW),
        ("agent_switched", True, NEW),
        ("agent_snapshotted", True, NEW),  # the new version's first start, before migrating
        ("agent_migrating", True, NEW),  # half-way through: restored, then migrated again
        ("agent_migrated", True, NEW),
        ("agent_confirming", True, NEW),
        ("agent_committing", True, NEW),  # committed record, pending left: tidied
        ("agent_committed", True, NEW),  # not yet reported: reported at the next start
        ("agent_restored", False, OLD),  # a failed version's rollback cut short
        ("agent_rolled_back", False, OLD),
    ],
)
def test_sigkill_at_each_step_of_the_switch_ends_on_one_consistent_version(
    tmp_path: Path, release, step, healthy, final
):
    envelope, trust = release
    layout = Layout(tmp_path / "opt")
    _install(layout, OLD)
    layout.adopt(OLD)
    device = Device(layout.root, _state(tmp_path), envelope, trust, healthy=healthy)
    _killed_at(step, device)
    for _ in range(4):  # the service manager starts it again, until nothing is on trial
        start(device)
        if not SwitchState(layout.root).pending_path.exists():
            break
    start(device)  # one more start changes nothing
    assert layout.current() == final and SwitchState(layout.root).pending() is None
    assert not (layout.root / snapshot.SNAPSHOT_DIR).exists()
    assert not SwitchState(layout.root).outcome_path.exists()
    record = SwitchState(layout.root).record()
    (_in_new_format if final == NEW else _in_old_format)(device.state)
    reported = [(o["version"], o["result"], o["code"]) for o in device.outcomes]
    if final == NEW:
        assert record.version == NEW and reported == [(NEW, "succeeded", "committed")]
    elif healthy:  # died before the switch was recorded: nothing to report yet
        assert record.version is None and reported == []
    else:
        assert record.bad == [NEW] and reported == [(NEW, "failed", "health_check_failed")]
        assert "state restored to format 1" in device.outcomes[0]["message"]
