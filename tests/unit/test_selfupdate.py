"""Agent releases and the A/B switch's decisions (issue 27), on real keys, files and links.

The processes (install, restart, rollback under a supervisor) are in
tests/integration/test_selfupdate.py; here: who may sign an agent release, the anti-rollback
floor, the wheelhouse reader, the layout's links and prune, and every boot check decision.
"""

from __future__ import annotations

import io
import json
import tarfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from edgeagent.fleet.agent_manifest import (
    AgentRefused,
    claimed_kind,
    parse_agent_manifest,
    this_platform,
    this_python,
    verify_agent_release,
)
from edgeagent.fleet.manifest import DeviceIdentity
from edgeagent.fleet.signing import VerificationError
from edgeagent.fleet.trust import TrustStore
from edgeagent.hub.agent_release import sign_agent_release
from edgeagent.hub.keys import keygen, rotate
from edgeagent.hub.serials import ReleaseSerials
from edgeagent.selfupdate.boot import boot_check
from edgeagent.selfupdate.install import InstallError, unpack_wheelhouse
from edgeagent.selfupdate.layout import MARKER, Layout
from edgeagent.selfupdate.state import AgentRecord, PendingSwitch, SwitchState

DEVICE = DeviceIdentity("dev-1", "generic-x86_64", "", agent_version="0.1.0")


def _wheels(directory: Path, version: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"edgeagent-{version}-py3-none-any.whl").write_bytes(
        b"PK fake " + version.encode()
    )
    return directory


def _sign(hub: Path, tmp: Path, version: str, key: str = "agent", **kw) -> bytes:
    path = sign_agent_release(
        {this_platform(): _wheels(tmp / f"wh-{version}", version)},
        key_paths=[hub / f"{key}.key"],
        base_url="http://hub.example:8000",
        out_dir=tmp / "out",
        serials=ReleaseSerials(hub / "serials.json"),
        **kw,
    )
    return path.read_bytes()


@pytest.fixture
def hub(tmp_path: Path) -> Path:
    keygen(tmp_path / "hub", agent_keys=1)
    return tmp_path / "hub"


def _trust(hub: Path, tmp: Path) -> TrustStore:
    return TrustStore.load(tmp / "device" / "trust.json", seed=hub / "trust.json")


def test_an_agent_release_verifies_under_the_agent_role(hub: Path, tmp_path: Path):
    envelope = _sign(hub, tmp_path, "0.2.0")
    assert claimed_kind(envelope, 1 << 20) == "agent_release"
    manifest, wheelhouse = verify_agent_release(
        envelope, _trust(hub, tmp_path), device=DEVICE, history=AgentRecord(),
        max_artifact_bytes=1 << 20,
    )  # fmt: skip
    assert (manifest.version, manifest.serial, manifest.python) == ("0.2.0", 1, this_python())
    assert wheelhouse.platform == this_platform()
    assert parse_agent_manifest(manifest.to_payload()) == manifest


def test_a_model_release_key_cannot_sign_an_agent_release(hub: Path, tmp_path: Path):
    envelope = _sign(hub, tmp_path, "0.2.0", key="release")
    with pytest.raises(VerificationError) as refused:
        verify_agent_release(
            envelope, _trust(hub, tmp_path), device=DEVICE, history=AgentRecord(),
            max_artifact_bytes=1 << 20,
        )  # fmt: skip
    assert refused.value.code == "unknown_key"
    # nor can the agent key sign a model release: the roles do not overlap
    with pytest.raises(VerificationError):
        _trust(hub, tmp_path).verify(_sign(hub, tmp_path, "0.3.0"), "release")


def test_a_trust_file_without_the_agent_role_takes_no_agent_release(tmp_path: Path):
    keygen(tmp_path / "old-hub")  # no --agent-keys
    keygen(tmp_path / "other", agent_keys=1)
    envelope = _sign(tmp_path / "other", tmp_path, "0.2.0")
    with pytest.raises(VerificationError) as refused:
        _trust(tmp_path / "old-hub", tmp_path).verify(envelope, "agent")
    assert refused.value.code == "no_role"


def test_a_rotation_keeps_the_agent_role(hub: Path, tmp_path: Path):
    rotate(hub / "trust.json", old_root_keys=[hub / "root.key"])
    store = TrustStore.load(hub / "trust.json")
    assert store.version == 2 and "agent" in store.root.roles
    store.verify(_sign(hub, tmp_path, "0.2.0"), "agent")


@pytest.mark.parametrize(
    ("record", "running", "code"),
    [
        (AgentRecord("0.3.0", 2), "0.3.0", "replay"),  # serial 1 below the committed 2
        (AgentRecord("0.2.0", 1), "0.2.0", "same_version"),
        (AgentRecord(), "0.3.0", "rollback"),  # no serial yet: the running version is the floor
        (AgentRecord(bad=["0.2.0"]), "0.1.0", "known_bad"),
    ],
)
def test_replays_and_downgrades_are_refused(hub, tmp_path, record, running, code):
    envelope = _sign(hub, tmp_path, "0.2.0")  # serial 1
    device = DeviceIdentity("dev-1", "p", "", agent_version=running)
    with pytest.raises(AgentRefused) as refused:
        verify_agent_release(
            envelope, _trust(hub, tmp_path), device=device, history=record,
            max_artifact_bytes=1 << 20,
        )  # fmt: skip
    assert refused.value.code == code and refused.value.manifest.version == "0.2.0"


def test_a_signed_downgrade_with_a_newer_serial_is_taken(hub: Path, tmp_path: Path):
    _sign(hub, tmp_path, "0.3.0")  # serial 1, committed below
    envelope = _sign(hub, tmp_path, "0.2.0")  # serial 2: a deliberate fleet rollback
    device = DeviceIdentity("dev-1", "p", "", agent_version="0.3.0")
    manifest, _ = verify_agent_release(
        envelope, _trust(hub, tmp_path), device=device, history=AgentRecord("0.3.0", 1),
        max_artifact_bytes=1 << 20,
    )  # fmt: skip
    assert manifest.serial == 2


@pytest.mark.parametrize(
    ("kwargs", "code"),
    [
        ({"platform_tag": "linux_riscv64"}, "wrong_platform"),
        ({"python": "3.99"}, "wrong_python"),
        ({"now": datetime.now(timezone.utc) + timedelta(days=90)}, "expired"),
    ],
)
def test_the_wrong_platform_python_or_time_is_refused(hub, tmp_path, kwargs, code):
    envelope = _sign(hub, tmp_path, "0.2.0")
    with pytest.raises(AgentRefused) as refused:
        verify_agent_release(
            envelope, _trust(hub, tmp_path), device=DEVICE, history=AgentRecord(),
            max_artifact_bytes=1 << 20, **kwargs,
        )  # fmt: skip
    assert refused.value.code == code


def _tar(members: dict[str, bytes], link: str | None = None) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if link:
            info = tarfile.TarInfo(link)
            info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
            tar.addfile(info)
    return buffer.getvalue()


@pytest.mark.parametrize(
    "members",
    [
        {"../evil.whl": b"x"},
        {"sub/a.whl": b"x"},
        {"run.sh": b"x"},
        {},
    ],
)
def test_a_wheelhouse_holds_flat_wheels_only(tmp_path: Path, members):
    archive = tmp_path / "wh.tar.gz"
    archive.write_bytes(_tar(members))
    with pytest.raises(InstallError) as refused:
        unpack_wheelhouse(archive, tmp_path / "out", max_bytes=1 << 20)
    assert refused.value.code == "bad_wheelhouse"
    assert not (tmp_path / "evil.whl").exists()


def test_a_wheelhouse_link_or_oversize_is_refused(tmp_path: Path):
    archive = tmp_path / "wh.tar.gz"
    archive.write_bytes(_tar({"a.whl": b"x"}, link="b.whl"))
    with pytest.raises(InstallError):
        unpack_wheelhouse(archive, tmp_path / "out", max_bytes=1 << 20)
    archive.write_bytes(_tar({"a.whl": b"x" * 100}))
    with pytest.raises(InstallError):
        unpack_wheelhouse(archive, tmp_path / "out2", max_bytes=10)
    archive.write_bytes(_tar({"a.whl": b"x"}))
    assert [p.name for p in unpack_wheelhouse(archive, tmp_path / "ok", 1 << 20)] == ["a.whl"]


def _installed(layout: Layout, *versions: str) -> None:
    for version in versions:
        (layout.venv(version)).mkdir(parents=True)
        (layout.version_dir(version) / MARKER).write_text("{}")


def test_switch_moves_both_links_and_prune_keeps_them(tmp_path: Path):
    layout = Layout(tmp_path)
    _installed(layout, "0.1.0", "0.2.0", "0.3.0", "0.4.0")
    layout.adopt("0.1.0")
    layout.switch("0.2.0")
    assert (layout.current(), layout.previous()) == ("0.2.0", "0.1.0")
    layout.switch("0.4.0")
    (layout.versions / "0.5.0").mkdir()  # unfinished: no marker
    assert layout.prune(keep=2) == ["0.5.0", "0.1.0", "0.3.0"]
    assert layout.installed() == ["0.2.0", "0.4.0"]
    assert (layout.current(), layout.previous()) == ("0.4.0", "0.2.0")


def _pending(**changes) -> PendingSwitch:
    values = {
        "from_version": "0.1.0",
        "to_version": "0.2.0",
        "serial": 7,
        "deployment_id": "agent-0.2.0",
        "deadline": time.time() + 600,
        "max_boots": 2,
        "models": ("tiny",),
        **changes,
    }
    return PendingSwitch(**values)


@pytest.fixture
def switched(tmp_path: Path) -> tuple[Layout, SwitchState]:
    layout, state = Layout(tmp_path), SwitchState(tmp_path)
    _installed(layout, "0.1.0", "0.2.0")
    layout.adopt("0.1.0")
    layout.switch("0.2.0")
    return layout, state


def test_boot_check_counts_starts_then_rolls_back(switched):
    layout, state = switched
    state.write_pending(_pending())
    assert "start 1 of 2" in boot_check(layout.root)
    assert "start 2 of 2" in boot_check(layout.root)
    assert layout.current() == "0.2.0"
    assert "rolled back" in boot_check(layout.root)  # a third start: never committed
    assert layout.current() == "0.1.0" and state.pending() is None
    assert state.record().bad == ["0.2.0"]
    outcome = state.take_outcome()
    assert outcome["result"] == "failed" and outcome["code"] == "no_commit"
    assert outcome["release"]["version"] == "0.2.0" and state.take_outcome() is None


@pytest.mark.parametrize(
    ("pending", "code"),
    [
        (_pending(verdict="health_check_failed: tiny gave the wrong class"), "health_check_failed"),
        (_pending(deadline=time.time() - 1), "deadline"),
    ],
)
def test_boot_check_rolls_back_a_verdict_or_a_missed_deadline(switched, pending, code):
    layout, state = switched
    state.write_pending(pending)
    boot_check(layout.root)
    assert layout.current() == "0.1.0" and state.take_outcome()["code"] == code


def test_boot_check_rolls_forward_a_switch_the_old_agent_did_not_finish(tmp_path: Path):
    layout, state = Layout(tmp_path), SwitchState(tmp_path)
    _installed(layout, "0.1.0", "0.2.0")
    layout.adopt("0.1.0")
    state.write_pending(_pending())  # recorded, then killed before the links moved
    assert "start 1" in boot_check(tmp_path)
    assert (layout.current(), layout.previous()) == ("0.2.0", "0.1.0")


def test_boot_check_tidies_a_commit_cut_short(switched):
    layout, state = switched
    state.write_pending(_pending())
    state.commit("0.2.0", 7)  # killed between the commit record and removing pending
    assert "committed" in boot_check(layout.root)
    assert state.pending() is None and layout.current() == "0.2.0"
    assert state.take_outcome()["result"] == "succeeded"


def test_boot_check_finishes_a_rollback_cut_short(switched):
    layout, state = switched
    state.write_pending(_pending(verdict="no_commit: crashed"))
    state.mark_bad("0.2.0")
    layout.point(layout.current_link, "0.1.0")  # killed before pending was removed
    boot_check(layout.root)
    assert layout.current() == "0.1.0" and state.pending() is None  # not rolled forward


def test_without_a_pending_switch_the_boot_check_does_nothing(switched):
    layout, state = switched
    assert boot_check(layout.root) == "no switch pending"
    assert layout.current() == "0.2.0" and not state.outcome_path.exists()


def test_a_corrupt_pending_record_is_named_and_the_start_goes_on(switched, capsys):
    from edgeagent.selfupdate.boot import main

    layout, state = switched
    state.pending_path.write_text("{not json")
    assert main(["--root", str(layout.root)]) == 0
    assert str(state.pending_path) in capsys.readouterr().err
    assert json.loads(json.dumps(layout.current())) == "0.2.0"
