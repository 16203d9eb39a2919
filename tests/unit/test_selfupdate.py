"""Agent releases and the A/B switch's decisions (issue 27), on real keys, files and links.

The processes (install, restart, rollback under a supervisor) are in
tests/integration/test_selfupdate.py; here: who may sign an agent release, the anti-rollback
floor, the wheelhouse reader, the layout's links and prune, and every boot check decision.
"""

from __future__ import annotations

import asyncio
import io
import json
import sys
import tarfile
import time
import zipfile
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from edgeagent import __version__
from edgeagent.fleet.agent_manifest import (
    AGENT_SLOT,
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
from edgeagent.hub.keys import HubError, keygen, rotate
from edgeagent.hub.serials import ReleaseSerials
from edgeagent.selfupdate.boot import boot_check
from edgeagent.selfupdate.install import InstallError, InstallSettings, unpack_wheelhouse
from edgeagent.selfupdate.layout import MARKER, Layout
from edgeagent.selfupdate.service import AgentUpdates, SwitchSettings
from edgeagent.selfupdate.state import AgentRecord, PendingSwitch, SwitchState
from edgeagent.updates.download import DownloadError

DEVICE = DeviceIdentity("dev-1", "generic-x86_64", "", agent_version="0.1.0")


def _wheels(directory: Path, version: str, says: str | None = None, *others: str) -> Path:
    """An agent wheel of ``version`` whose code says ``says`` (default: the same), and empty
    wheels named ``others`` beside it (their names are all ``hub sign`` reads of them)."""
    directory.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(directory / f"edgeagent-{version}-py3-none-any.whl", "w") as wheel:
        wheel.writestr(
            "edgeagent/__init__.py", f'"""The agent."""\n\n__version__ = "{says or version}"\n'
        )
    for name in others:
        (directory / name).write_bytes(b"")
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


# --- what hub sign --agent refuses ----------------------------------------------------------

X86 = "numpy-2.0.0-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
ARM = "numpy-2.0.0-cp311-cp311-manylinux_2_17_aarch64.manylinux2014_aarch64.whl"


def _sign_dir(hub: Path, tmp: Path, wheelhouse: Path, platform: str, python: str) -> Path:
    return sign_agent_release(
        {platform: wheelhouse}, key_paths=[hub / "agent.key"], base_url="http://hub:8000",
        out_dir=tmp / "out", serials=ReleaseSerials(hub / "serials.json"), python=python,
    )  # fmt: skip


def test_sign_refuses_an_agent_wheel_whose_code_says_another_version(hub: Path, tmp_path: Path):
    wheelhouse = _wheels(tmp_path / "wh", "0.2.0", "0.1.0")  # bumped in one place only
    with pytest.raises(HubError, match=r"its code says __version__ = '0.1.0'"):
        _sign_dir(hub, tmp_path, wheelhouse, "linux_x86_64", "3.11")
    assert not (tmp_path / "out").exists()  # nothing written, no serial used
    assert ReleaseSerials(hub / "serials.json").next("edgeagent") == 1


@pytest.mark.parametrize(
    ("platform", "python", "others", "refused"),
    [
        ("linux_aarch64", "3.11", [X86], X86),  # built on x86_64, signed for aarch64
        ("linux_x86_64", "3.12", [X86], X86),  # an extension built for another CPython
        ("linux_x86_64", "3.11", [X86, "tool-1.0-py3-none-macosx_11_0_arm64.whl"], "tool"),
        ("linux_aarch64", "3.11", [ARM, "c-1.0-cp39-abi3-manylinux2014_aarch64.whl"], None),
        ("linux_x86_64", "3.11", [X86, "p-1.0-py2.py3-none-any.whl"], None),
    ],
)
def test_sign_refuses_wheels_for_another_platform_or_python(
    hub, tmp_path, platform, python, others, refused
):
    wheelhouse = _wheels(tmp_path / "wh", "0.2.0", None, *others)
    if refused is None:
        _sign_dir(hub, tmp_path, wheelhouse, platform, python)  # control: they fit
        return
    with pytest.raises(HubError, match=f"{refused}.* cannot install on {platform} with Python"):
        _sign_dir(hub, tmp_path, wheelhouse, platform, python)


def test_the_hub_sign_command_names_the_wheels_of_the_wrong_platform(hub: Path, tmp_path: Path):
    from edgeagent.cli import main

    wheelhouse = _wheels(tmp_path / "wh", "0.2.0", None, X86)
    args = ["hub", "sign", "--agent", str(wheelhouse), "--key", str(hub / "agent.key"),
            "--base-url", "http://hub:8000", "--out", str(tmp_path / "out"),
            "--python", "3.11"]  # fmt: skip
    assert main([*args, "--platform", "linux_aarch64"]) == 2
    assert not (tmp_path / "out").exists()
    assert main([*args, "--platform", "linux_x86_64"]) == 0  # control


# --- pruning after a rollback ---------------------------------------------------------------


def test_prune_drops_the_version_that_failed_and_keeps_the_good_one_before(tmp_path: Path):
    """0.1.0 → 0.2.0 committed; 0.3.0 rolled back (``previous`` then names 0.2.0 as current
    does); 0.4.0 committed: the prune keeps 0.1.0, known good, and drops 0.3.0, known bad."""
    layout, state = Layout(tmp_path), SwitchState(tmp_path)
    _installed(layout, "0.1.0", "0.2.0", "0.3.0", "0.4.0")
    layout.adopt("0.1.0")
    layout.switch("0.2.0")
    state.write_pending(_pending(from_version="0.2.0", to_version="0.3.0", verdict="no_commit: x"))
    layout.switch("0.3.0")
    assert "rolled back" in boot_check(tmp_path)
    layout.switch("0.4.0")
    assert layout.prune(keep=3, bad=state.record().bad) == ["0.3.0"]
    assert layout.installed() == ["0.1.0", "0.2.0", "0.4.0"]


# --- the running agent's side: refusals, and a switch it cannot confirm ---------------------


class _Reporter:
    def __init__(self) -> None:
        self.outcomes: list[dict] = []

    def outcome(self, release, result, code, message, *, persist=True) -> dict:
        record = {"version": release["version"], "result": result, "code": code, "msg": message}
        self.outcomes.append(record)
        return record

    def progress(self, release, step, **detail) -> None:
        pass


def _agent(tmp: Path, *, download=None, prepare=None, restart=lambda: None) -> AgentUpdates:
    """The running agent (this checkout's version, current under an A/B root)."""
    layout = Layout(tmp / "opt")
    if layout.current() is None:
        _installed(layout, __version__)
        layout.adopt(__version__)

    async def no_download(artifact, release) -> Path:
        raise AssertionError("not downloaded")

    class Updates(AgentUpdates):
        def _prepare(self, version: str, archive: Path) -> None:
            (prepare or (lambda v, a: None))(version, archive)

    settings = SwitchSettings(
        root=layout.root, config_file=tmp / "agent.toml", keep_versions=3, max_boots=3,
        commit_deadline_s=600.0, install=InstallSettings(60.0, 1 << 20),
        max_artifact_bytes=1 << 20, clock_skew_s=300.0,
    )  # fmt: skip
    return Updates(
        settings, device=DeviceIdentity("dev-1", "p", "", agent_version=__version__),
        reporter=_Reporter(), download=download or no_download, served_models=lambda: [],
        check_model=lambda name: asyncio.sleep(0), restart=restart,
    )  # fmt: skip


async def _tampered(artifact, release) -> Path:
    raise DownloadError("hash_mismatch", f"{artifact.url}: sha256 is not the manifest's")


def _install_fails(version: str, archive: Path) -> None:
    raise InstallError("install_failed", "pip install exited 1: no matching distribution")


@pytest.mark.parametrize(
    ("download", "prepare", "code"),
    [(_tampered, None, "hash_mismatch"), (None, _install_fails, "install_failed")],
)
async def test_a_tampered_wheelhouse_or_a_failed_install_is_refused_nothing_changed(
    hub, tmp_path, download, prepare, code
):
    async def fetched(artifact, release) -> Path:
        (tmp_path / "wh.tar.gz").write_bytes(b"wheels")
        return tmp_path / "wh.tar.gz"

    updates = _agent(tmp_path, download=download or fetched, prepare=prepare)
    outcome = await updates.apply(_sign(hub, tmp_path, "9.0.0"), _trust(hub, tmp_path))
    assert (outcome["result"], outcome["code"]) == ("refused", code), outcome
    assert updates.layout.current() == __version__ and updates.state.pending() is None
    assert not updates.layout.version_dir("9.0.0").exists()


def _switched_to(updates: AgentUpdates, version: str, deadline: float) -> PendingSwitch:
    """What the old agent leaves when it switched to ``version`` and restarted."""
    pending = _pending(from_version=__version__, to_version=version, deadline=deadline)
    updates.state.write_pending(pending)
    updates.layout.switch(version)
    return pending


async def test_a_switch_nobody_confirms_ends_at_its_deadline_while_the_agent_runs(
    hub: Path, tmp_path: Path
):
    """A version on trial that does not confirm (here: the running code is another version)
    is failed at the deadline without waiting for a restart, and the boot check rolls it back;
    the next agent release is then taken, not refused as ``switch_pending``."""
    restarted = asyncio.Event()
    updates = _agent(tmp_path, restart=restarted.set)
    _installed(updates.layout, "9.0.0")
    _switched_to(updates, "9.0.0", deadline=time.time() + 0.5)
    updates.start()
    assert updates.confirming is None and updates.watching is not None
    await asyncio.wait_for(restarted.wait(), 60)
    assert updates.state.pending().verdict.startswith("deadline: ")
    assert "rolled back" in boot_check(updates.layout.root)
    assert updates.layout.current() == __version__ and updates.state.record().bad == ["9.0.0"]
    outcome = await updates.apply(_sign(hub, tmp_path, "9.1.0"), _trust(hub, tmp_path))
    assert outcome["code"] != "switch_pending", outcome


async def test_a_version_whose_code_says_another_version_fails_its_trial_at_once(
    tmp_path: Path,
):
    """versions/9.0.0/venv is this interpreter, whose edgeagent says it is __version__."""
    restarted = asyncio.Event()
    updates = _agent(tmp_path, restart=restarted.set)
    updates.layout.version_dir("9.0.0").mkdir(parents=True)
    updates.layout.venv("9.0.0").symlink_to(Path(sys.prefix).resolve())
    (updates.layout.version_dir("9.0.0") / MARKER).write_text("{}")
    _switched_to(updates, "9.0.0", deadline=time.time() + 600)
    updates.start()
    await asyncio.wait_for(restarted.wait(), 60)
    verdict = updates.state.pending().verdict
    assert verdict.startswith("version_mismatch: ") and f"runs agent {__version__}" in verdict
    await updates.stop()


# --- what the docs tell an operator ---------------------------------------------------------

DOCS = Path(__file__).resolve().parents[2] / "docs" / "fleet" / "agent-updates.md"


def test_the_drop_in_in_the_docs_is_the_one_init_prints():
    from edgeagent.commands.selfupdate import dropin

    text = DOCS.read_text()
    shown = text.split("sudo systemctl edit edgeagent", 1)[1].split("```", 1)[0]
    lines = [line.removeprefix("#   ") for line in shown.splitlines()[1:] if line.strip()]
    assert "\n".join(lines) + "\n" == dropin(Path("/opt/edgeagent"))


def test_the_version_is_written_in_one_place():
    """The wheel's version is ``__version__`` (pyproject reads it), so the two cannot differ."""
    from edgeagent._toml import tomllib

    pyproject = tomllib.loads((DOCS.parents[2] / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"] and "version" in pyproject["project"]["dynamic"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "edgeagent.__version__"
    }
    assert "edgeagent/__init__.py" in DOCS.read_text()  # and the docs say where to raise it


def test_hub_publish_fills_the_agent_slot_with_agent_releases_only(hub: Path, tmp_path: Path):
    """Without a hub server, ``hub publish`` puts an agent release in the group's ``_agent``
    slot, and refuses one whose serial is not above the release retained there."""
    from edgeagent.hub.publish import ReleaseSlot, _check_slot, read_any_release, release_topics

    first, second = _sign(hub, tmp_path, "0.2.0"), _sign(hub, tmp_path, "0.3.0")
    path = tmp_path / "out" / "edgeagent-0.3.0.agent-release.json"
    envelope, manifest = read_any_release(path, hub / "trust.json")
    assert envelope == second and manifest.version == "0.3.0"
    (slot,) = release_topics("edgeagent", "lab", [], AGENT_SLOT)
    assert isinstance(slot, ReleaseSlot) and slot.name == "edgeagent/group/lab/release/_agent"
    _check_slot(slot, None, first)  # an empty slot takes it
    _check_slot(slot, first, second)  # a higher serial replaces it
    with pytest.raises(HubError, match="serial 1 is not above it"):
        _check_slot(slot, second, first)  # a replay of the older one does not
