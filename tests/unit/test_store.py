"""The versioned store: atomic install, current pointer, floors, bad list, GC and recovery."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from edgeagent.updates.store import (
    ModelStore,
    PendingInstall,
    StoreError,
    check_name,
    check_version,
)


def _package(tmp: Path, name: str, text: str = "x") -> Path:
    staged = tmp / "staging" / f"unpack-{name}-{text}"
    staged.mkdir(parents=True)
    (staged / "model.toml").write_text(f"name = '{name}'\n# {text}\n")
    return staged


def _install(store: ModelStore, tmp: Path, model: str, version: str) -> Path:
    return store.install(model, version, _package(tmp, model, version))


def test_install_is_a_rename_and_current_is_a_relative_symlink(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    staged = _package(tmp_path, "m", "1")
    path = store.install("m", "1", staged)
    assert path == tmp_path / "store" / "m" / "1" and not staged.exists()
    assert store.current("m") is None
    store.set_current("m", "1")
    assert os.readlink(tmp_path / "store" / "m" / "current") == "1"
    assert store.current_dirs() == {"m": path}


def test_set_current_refuses_a_version_that_is_not_installed(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    with pytest.raises(StoreError, match="not installed"):
        store.set_current("m", "2")


@pytest.mark.parametrize("name", ["../evil", "a/b", "", ".hidden"])
def test_names_that_could_escape_the_store_are_refused(tmp_path: Path, name: str) -> None:
    store = ModelStore(tmp_path)
    with pytest.raises(StoreError, match="model name"):
        store.install(name, "1", _package(tmp_path, "m"))


def test_the_serial_floor_only_rises_and_bad_versions_accumulate(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    assert store.serial_floor("m") is None
    store.raise_floor("m", "1.2.0", 1)
    store.raise_floor("m", "1.10", 3)
    store.raise_floor("m", "1.11", 2)  # a lower serial changes nothing
    assert (store.floor("m"), store.serial_floor("m")) == ("1.10", 3)
    store.raise_floor("m", "1.0.0", 4)  # a signed rollback: the version may go down
    assert (store.floor("m"), ModelStore(tmp_path).serial_floor("m")) == ("1.0.0", 4)
    store.mark_bad("m", "3")
    store.mark_bad("m", "2")
    assert ModelStore(tmp_path).bad_versions("m") == {"2", "3"}


def test_corrupt_records_are_reported_with_their_path(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    (tmp_path / "store" / "floors.json").write_text("{not json")
    with pytest.raises(StoreError, match=r"floors\.json: corrupt"):
        store.floor("m")


def test_gc_keeps_current_and_n_previous_and_drops_rolled_back_ones(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    for version in ("1", "2", "3", "4", "5"):
        _install(store, tmp_path, "m", version)
    store.set_current("m", "4")
    assert store.gc("m", keep=2) == ["1", "5"]
    assert store.versions("m") == ["2", "3", "4"]


def test_only_one_install_may_be_pending(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    store.begin(PendingInstall("m", "2", "1", "d1"))
    with pytest.raises(StoreError, match="still pending"):
        store.begin(PendingInstall("m", "3", "1", "d2"))


def test_recover_rolls_back_an_uncommitted_install(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    _install(store, tmp_path, "m", "1")
    store.set_current("m", "1")
    store.raise_floor("m", "1", 1)
    pending = PendingInstall("m", "2", "1", "d1", serial=2)
    store.begin(pending)
    _install(store, tmp_path, "m", "2")
    store.advance(pending, "activating")
    store.set_current("m", "2")
    (tmp_path / "staging" / "unpack-leftover").mkdir()

    recovery = ModelStore(tmp_path).recover()
    assert recovery is not None and recovery.outcome == "rolled_back"
    assert store.current("m") == "1" and store.versions("m") == ["1"]
    assert store.pending() is None and store.floor("m") == "1"
    assert store.bad_versions("m") == {"2"}  # it crashed while loading: do not retry forever
    assert not (tmp_path / "staging" / "unpack-leftover").exists()


def test_recover_does_not_blame_a_release_for_a_crash_while_downloading(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    store.begin(PendingInstall("m", "2", None, "d1"))
    recovery = store.recover()
    assert recovery is not None and recovery.outcome == "rolled_back"
    assert store.bad_versions("m") == set() and store.current("m") is None


def test_recover_finishes_an_install_whose_floor_was_raised(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    _install(store, tmp_path, "m", "1")
    store.set_current("m", "1")
    pending = PendingInstall("m", "2", "1", "d1", serial=7)
    store.begin(pending)
    _install(store, tmp_path, "m", "2")
    store.advance(pending, "committing")
    store.raise_floor("m", "2", 7)
    recovery = store.recover()
    assert recovery is not None and recovery.outcome == "committed"
    assert store.current("m") == "2" and store.pending() is None


def test_recover_finishes_a_committed_rollback_to_an_older_version(tmp_path: Path) -> None:
    """Committed means "the serial floor reached this release's serial", not "the version is
    at most the floor": a rollback from 2 to 1 is finished, not undone."""
    store = ModelStore(tmp_path)
    for version in ("1", "2"):
        _install(store, tmp_path, "m", version)
    store.set_current("m", "2")
    store.raise_floor("m", "2", 2)
    pending = PendingInstall("m", "1", "2", "rollback", serial=3)
    store.begin(pending)
    store.advance(pending, "committing")
    store.set_current("m", "1")
    store.raise_floor("m", "1", 3)
    recovery = ModelStore(tmp_path).recover()
    assert recovery is not None and recovery.outcome == "committed"
    assert store.current("m") == "1"


def test_reset_floor_forgets_the_serial_so_the_version_floor_applies(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    store.raise_floor("m", "9", 999)
    store.reset_floor("m", "1.4.0")
    assert (store.floor("m"), store.serial_floor("m")) == ("1.4.0", None)


def test_snapshot_is_stable_when_nothing_changes(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    _install(store, tmp_path, "m", "1")
    store.set_current("m", "1")
    assert store.snapshot() == ModelStore(tmp_path).snapshot()
    assert store.snapshot()["current"] == {"m": "1"}


def test_recover_keeps_fresh_partial_downloads_and_drops_stale_ones(tmp_path: Path) -> None:
    store = ModelStore(tmp_path)
    fresh, stale = store.staging / "a.part", store.staging / "b.part"
    fresh.write_bytes(b"x")
    stale.write_bytes(b"y")
    old = time.time() - 2 * 24 * 3600
    os.utime(stale, (old, old))
    store.recover()
    assert fresh.exists() and not stale.exists()


@pytest.mark.parametrize("version", ["21\n", "\u0662", "1" * 256, "1.2.3.4"])
def test_the_store_refuses_versions_that_are_not_plain_bounded_ascii(version: str) -> None:
    with pytest.raises(StoreError):
        check_version(version)


@pytest.mark.parametrize("name", ["tiny\n", "t\u0131ny", "a" * 65])
def test_the_store_refuses_names_that_are_not_plain_bounded_ascii(name: str) -> None:
    with pytest.raises(StoreError):
        check_name(name)
