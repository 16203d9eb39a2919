"""A state snapshot and its rollback never act through a symbolic link out of the state tree.

A migration's ``touches`` name paths under the state directory; when a directory on the way is
a link, the snapshot would copy a file of elsewhere into itself and the rollback would rewrite
one outside file and delete another. The snapshot now refuses such a path (and a switch on
trial that needs it is rolled back at once); a rollback that finds a directory turned into a
link since makes it a directory again and touches nothing beyond it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeagent.fsutil import write_json_atomic
from edgeagent.selfupdate import snapshot
from edgeagent.selfupdate.layout import MARKER, Layout
from edgeagent.selfupdate.migrations import MIGRATIONS, Migration
from edgeagent.selfupdate.state import PendingSwitch, StateError, SwitchState
from edgeagent.selfupdate.stateformat import StateFormatError, prepare_state

PENDING = PendingSwitch("0.1.0", "0.2.0", 3, "d", 4e9, 3, boots=1)
TOUCHES = ("store/floors.json", "store/new.json")


def _outside(tmp: Path) -> Path:
    """A directory outside the state tree holding files the agent must never touch."""
    outside = tmp / "outside"
    outside.mkdir()
    (outside / "floors.json").write_text("OUTSIDE FLOORS")
    (outside / "new.json").write_text("OUTSIDE NEW")
    return outside


def _state(tmp: Path) -> Path:
    state = tmp / "state"
    (state / "store").mkdir(parents=True)
    (state / "store" / "floors.json").write_text("SAVED FLOORS")
    return state


def test_a_snapshot_refuses_a_path_through_a_linked_directory(tmp_path: Path) -> None:
    outside, state = _outside(tmp_path), tmp_path / "state"
    state.mkdir()
    (state / "store").symlink_to(outside)
    root = tmp_path / "root"
    root.mkdir()
    with pytest.raises(StateError, match=r"store is a symbolic link, so 'store/floors.json'"):
        snapshot.take(root, PENDING, state, 1, TOUCHES)
    assert snapshot.load(root) is None
    assert not any((root / ".state-snapshot.new").rglob("floors.json"))


def test_a_rollback_writes_and_deletes_nothing_outside_the_state_tree(tmp_path: Path) -> None:
    outside, state = _outside(tmp_path), _state(tmp_path)
    root = tmp_path / "root"
    root.mkdir()
    saved = snapshot.take(root, PENDING, state, 1, TOUCHES)
    assert saved.saved == ("store/floors.json",) and saved.absent == ("store/new.json",)
    # since the snapshot, store/ was replaced by a link to a directory elsewhere
    (state / "store" / "floors.json").unlink()
    (state / "store").rmdir()
    (state / "store").symlink_to(outside)
    snapshot.restore(root, saved)
    assert (outside / "floors.json").read_text() == "OUTSIDE FLOORS"
    assert (outside / "new.json").read_text() == "OUTSIDE NEW"
    assert not (state / "store").is_symlink()
    assert (state / "store" / "floors.json").read_text() == "SAVED FLOORS"
    assert not (state / "store" / "new.json").exists()


def test_a_rollback_deletes_nothing_beneath_a_link(tmp_path: Path) -> None:
    outside, state = _outside(tmp_path), tmp_path / "state"
    state.mkdir()
    root = tmp_path / "root"
    root.mkdir()
    saved = snapshot.take(root, PENDING, state, 1, ("store/new.json",))
    assert saved.absent == ("store/new.json",)
    (state / "store").symlink_to(outside)
    snapshot.restore(root, saved)
    assert (outside / "new.json").read_text() == "OUTSIDE NEW"


def test_the_final_component_may_be_a_link_and_is_saved_as_one(tmp_path: Path) -> None:
    """The control: a link that *is* a touched path is saved and put back as the link."""
    outside, state = _outside(tmp_path), _state(tmp_path)
    (state / "store" / "floors.json").unlink()
    (state / "store" / "floors.json").symlink_to(outside / "floors.json")
    root = tmp_path / "root"
    root.mkdir()
    saved = snapshot.take(root, PENDING, state, 1, TOUCHES)
    (state / "store" / "floors.json").unlink()
    (state / "store" / "floors.json").write_text("MIGRATED")
    snapshot.restore(root, saved)
    assert (state / "store" / "floors.json").readlink() == outside / "floors.json"
    assert (outside / "floors.json").read_text() == "OUTSIDE FLOORS"


def test_a_switch_on_trial_whose_migration_goes_through_a_link_is_refused(tmp_path: Path) -> None:
    """prepare_state turns the snapshot's refusal into the switch's verdict: the boot check
    rolls back at once, with nothing migrated."""
    outside, state = _outside(tmp_path), tmp_path / "state"
    state.mkdir()
    (state / "store").symlink_to(outside)
    write_json_atomic(state / "state-format.json", {"format": 1, "written_by": "0.1.0"})
    root = tmp_path / "opt"
    layout = Layout(root)
    for version in ("0.1.0", "0.2.0"):
        layout.venv(version).mkdir(parents=True)
        (layout.version_dir(version) / MARKER).write_text("{}")
    layout.adopt("0.1.0")
    SwitchState(root).write_pending(PENDING)
    layout.switch("0.2.0")
    migrated: list[Path] = []
    step = Migration(2, "test", TOUCHES, migrated.append)
    with pytest.raises(StateFormatError, match="is a symbolic link"):
        prepare_state(state, root, version="0.2.0", migrations=(*MIGRATIONS, step))
    pending = SwitchState(root).pending()
    assert pending is not None and pending.verdict.startswith("state_refused: ")
    assert migrated == [] and (outside / "floors.json").read_text() == "OUTSIDE FLOORS"
