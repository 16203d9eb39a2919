"""What a state migration rewrites, saved under the A/B root until the switch is decided.

::

    <root>/state-snapshot/            mode 0700: it may hold a copy of the device key
        snapshot.json                 the switch it belongs to, the state directory, the format
                                      the state was in, the paths saved and those that were absent
        files/<path>                  each saved path as it was (a file, a link, or a directory)

The new version takes it at its first start on trial, before its migration touches a file: it
is written under a temporary name, fsynced, and renamed into place, so a snapshot that exists
is complete. ``restore`` is the boot check's rollback, run by the *old* version's code: each
saved path is put back (copied beside its place, then renamed over it) and each path that was
absent is deleted. Neither ever goes through a symbolic link out of the state tree: a snapshot
refuses a path whose directories include a link, and a rollback makes a directory that became
a link since a directory again (and deletes nothing beneath one). It only reads the snapshot,
so a rollback cut short is simply run again. A commit, or a boot check that finds no switch on
trial, discards it. Older versions' boot checks read this layout: like the switch records, it
only ever gains keys.
"""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass
from pathlib import Path, PurePosixPath

from edgeagent.fsutil import fsync_dir, fsync_file, fsync_tree, write_json_atomic
from edgeagent.selfupdate.state import PendingSwitch, StateError, read_record

SNAPSHOT_DIR = "state-snapshot"
_RECORD = "snapshot.json"


@dataclass(frozen=True)
class Snapshot:
    to_version: str  # the switch it belongs to (with serial): a leftover of another is stale
    serial: int
    state_dir: str
    format: int  # the state format it saved: what a rollback returns the state to
    saved: tuple[str, ...]
    absent: tuple[str, ...]

    def belongs_to(self, pending: PendingSwitch) -> bool:
        return (self.to_version, self.serial) == (pending.to_version, pending.serial)


def _relative(path: str) -> str:
    """A path inside the state directory; anything else is refused (the record is read back)."""
    parts = PurePosixPath(path).parts
    if not parts or PurePosixPath(path).is_absolute() or ".." in parts:
        raise StateError(f"state snapshot: {path!r} is not a path inside the state directory")
    return str(PurePosixPath(*parts))


def _linked_directory(base: Path, relative: str) -> Path | None:
    """The first directory on the way from ``base`` to ``relative`` that is a symbolic link.

    The saved paths are copied out at a snapshot and written and deleted at a rollback: through
    a linked directory both would act on files outside the state tree (copy a file of elsewhere
    into the snapshot, rewrite or delete one at the rollback). The last component may be a
    link: it is saved and put back as the link itself, never followed.
    """
    here = base
    for part in PurePosixPath(relative).parts[:-1]:
        here = here / part
        if here.is_symlink():
            return here
    return None


def _within(base: Path, relative: str) -> Path:
    """``base / relative``; StateError when a directory on the way is a link."""
    link = _linked_directory(base, relative)
    if link is not None:
        raise StateError(
            f"state snapshot: {link} is a symbolic link, so {relative!r} is outside {base}; "
            "a migration's paths must be inside the state directory (replace the link with "
            "the directory itself)"
        )
    return base / relative


def _unlinked(base: Path, relative: str) -> Path:
    """``base / relative`` with each directory on the way that became a link since the
    snapshot (which refused links) made a directory again: the rollback writes the tree as it
    was saved, and nothing outside it."""
    while (link := _linked_directory(base, relative)) is not None:
        link.unlink()
        link.mkdir(mode=0o700)
        fsync_dir(link.parent)
    return base / relative


def _exists(path: Path) -> bool:
    return path.exists() or path.is_symlink()


def _delete(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _copy(source: Path, target: Path) -> None:
    """A file, a link (as a link) or a directory tree, fsynced."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.is_dir() and not source.is_symlink():
        shutil.copytree(source, target, symlinks=True)
        fsync_tree(target)
    else:
        shutil.copy2(source, target, follow_symlinks=False)
        if not target.is_symlink():
            fsync_file(target)


def take(
    root: Path, pending: PendingSwitch, state_dir: Path, state_format: int, paths: tuple[str, ...]
) -> Snapshot:
    """Save ``paths`` (relative to ``state_dir``) for ``pending``; replaces any older snapshot."""
    state_dir = Path(state_dir).resolve()
    relative = tuple(dict.fromkeys(_relative(p) for p in paths))
    building = root / f".{SNAPSHOT_DIR}.new"
    _delete(building)
    (building / "files").mkdir(parents=True, mode=0o700)
    building.chmod(0o700)
    saved = tuple(p for p in relative if _exists(_within(state_dir, p)))
    for path in saved:
        _copy(state_dir / path, building / "files" / path)
    snapshot = Snapshot(
        pending.to_version,
        pending.serial,
        str(state_dir),
        state_format,
        saved,
        tuple(p for p in relative if p not in saved),
    )
    write_json_atomic(building / _RECORD, asdict(snapshot))
    fsync_dir(building)
    discard(root)
    building.rename(root / SNAPSHOT_DIR)
    fsync_dir(root)
    return snapshot


def load(root: Path) -> Snapshot | None:
    """The snapshot under ``root``, or None; StateError when its record cannot be read."""
    path = root / SNAPSHOT_DIR / _RECORD
    data = read_record(path)
    if data is None:
        return None
    try:
        known = Snapshot.__dataclass_fields__
        fields = {k: v for k, v in data.items() if k in known}
        for key in ("saved", "absent"):
            fields[key] = tuple(_relative(str(p)) for p in fields[key])
        return Snapshot(**fields)
    except (AttributeError, KeyError, TypeError) as exc:
        raise StateError(f"{path}: {exc}") from exc


def restore(root: Path, snapshot: Snapshot) -> None:
    """Put the state's saved paths back and delete those that were absent (idempotent)."""
    state_dir = Path(snapshot.state_dir)
    for path in snapshot.saved:
        target = _unlinked(state_dir, path)
        incoming = target.with_name(f".{target.name}.restore")
        outgoing = target.with_name(f".{target.name}.replaced")
        _delete(incoming)
        _delete(outgoing)
        _copy(_within(root / SNAPSHOT_DIR / "files", path), incoming)
        if target.is_dir() and not target.is_symlink():  # a directory cannot be renamed over
            target.rename(outgoing)
        incoming.replace(target)
        fsync_dir(target.parent)
        _delete(outgoing)
    for path in snapshot.absent:
        target = state_dir / path
        if _linked_directory(state_dir, path) is None and _exists(target):  # else: not in it
            _delete(target)
            fsync_dir(target.parent)


def discard(root: Path) -> bool:
    """Remove the snapshot (the switch is decided); True when there was one."""
    path = root / SNAPSHOT_DIR
    if not _exists(path):
        return False
    _delete(path)
    fsync_dir(root)
    return True
