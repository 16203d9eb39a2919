"""The versioned model store: where verified releases live, and the only place that changes them.

Layout under ``<state_dir>/store``::

    <model>/<version>/      one installed release (an unpacked model package), never modified
    <model>/current         symlink to the version served at start-up (swapped atomically)
    floors.json             {model: version} — the version committed last (or a root-signed
                            reset); a version floor only while the model has no serial
    serials.json            {model: serial} — the anti-rollback floor of release format 2:
                            the serial of the release committed last, raised only on commit
    bad.json                {model: [version, ...]} — releases that failed their health gate
    pending.json            the install in progress, so a restart can finish or undo it

Every change is crash-safe in the RAUC/Mender way: a release is written into a hidden sibling
directory, every file and the directory are fsynced, then one ``rename`` makes it visible and
the parent is fsynced; ``current`` is replaced by renaming a new symlink over it; JSON records
are written to a temporary file, fsynced and renamed. A power cut at any instant therefore
leaves either the old state or the new state, never a mix, and ``recover()`` at start-up turns
a half-done install into a finished or a rolled-back one.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from edgeagent.fsutil import fsync_dir, fsync_tree, write_json_atomic
from edgeagent.models.package import NAME_RE, VERSION_RE, version_tuple

log = logging.getLogger(__name__)

# Install steps in order; pending.json records the last one reached.
STEPS = (
    "verified",
    "downloaded",
    "unpacked",
    "installed",
    "activating",
    "canary",  # loaded beside the old version, judged on live traffic; current is still old
    "committing",
)
STAGING_MAX_AGE_S = 24 * 3600  # partial downloads older than this are deleted at start-up


class StoreError(RuntimeError):
    """The store cannot do what was asked; the message names the model, version or file."""


@dataclass
class PendingInstall:
    """The install in progress; persisted before each step so a restart knows where it stopped."""

    model: str
    version: str
    previous: str | None  # the version that was current when the install began
    deployment_id: str
    serial: int = 0  # 0 only in a record left by an agent of release format 1
    step: str = "verified"
    started_at: float = field(default_factory=time.time)


@dataclass(frozen=True)
class Recovery:
    """What ``recover()`` did with a pending install found at start-up."""

    pending: PendingInstall
    outcome: str  # "committed" or "rolled_back"
    reason: str


def check_name(model: str) -> str:
    if not NAME_RE.match(model):
        raise StoreError(f"model name {model!r} is not 1-64 letters, digits, '_', '-' or '.'")
    return model


def check_version(version: str) -> str:
    if not VERSION_RE.match(version):
        raise StoreError(f"version {version!r} is not an integer or MAJOR.MINOR.PATCH")
    return version


def _read_json(path: Path, default: Any) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return default
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise StoreError(f"{path}: corrupt store record ({exc}); restore it or delete it") from exc


class ModelStore:
    """Installed releases, the ``current`` pointers, floors, bad releases and the pending record."""

    def __init__(self, state_dir: Path) -> None:
        self.root = Path(state_dir) / "store"
        self.staging = Path(state_dir) / "staging"
        self.root.mkdir(parents=True, exist_ok=True)
        self.staging.mkdir(parents=True, exist_ok=True)

    # --- reading -------------------------------------------------------------------------
    def models(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and NAME_RE.match(p.name))

    def versions(self, model: str) -> list[str]:
        """Installed versions of ``model``, oldest first."""
        directory = self.root / check_name(model)
        if not directory.is_dir():
            return []
        found = [p.name for p in directory.iterdir() if p.is_dir() and not p.is_symlink()]
        return sorted((v for v in found if VERSION_RE.match(v)), key=version_tuple)

    def current(self, model: str) -> str | None:
        """The version ``current`` points to, or None when the model has no installed release."""
        link = self.root / check_name(model) / "current"
        try:
            target = os.readlink(link)
        except FileNotFoundError:
            return None
        return target if (link.parent / target).is_dir() else None

    def current_dir(self, model: str) -> Path | None:
        version = self.current(model)
        return None if version is None else self.root / model / version

    def current_dirs(self) -> dict[str, Path]:
        """{model: package directory} of every model with a current release — what to serve."""
        result = {}
        for model in self.models():
            path = self.current_dir(model)
            if path is not None:
                result[model] = path
        return result

    def floor(self, model: str) -> str | None:
        return self._floors().get(model)

    def serial_floor(self, model: str) -> int | None:
        """The serial committed last for ``model``; None before the first commit or after a
        root-signed floor reset (then ``floor`` is a version floor)."""
        serial = self._serials().get(model)
        return serial if isinstance(serial, int) and not isinstance(serial, bool) else None

    def bad_versions(self, model: str) -> set[str]:
        return set(self._bad().get(model, []))

    def pending(self) -> PendingInstall | None:
        data = _read_json(self.root / "pending.json", None)
        if data is None:
            return None
        try:
            return PendingInstall(**data)
        except TypeError as exc:
            raise StoreError(f"{self.root / 'pending.json'}: unexpected fields ({exc})") from exc

    def snapshot(self) -> dict[str, Any]:
        """Everything the trusted state consists of; equal snapshots mean nothing changed."""
        return {
            "floors": self._floors(),
            "serials": self._serials(),
            "bad": self._bad(),
            "pending": _read_json(self.root / "pending.json", None),
            "current": {m: self.current(m) for m in self.models()},
            "versions": {m: self.versions(m) for m in self.models()},
        }

    # --- changing ------------------------------------------------------------------------
    def install(self, model: str, version: str, unpacked: Path) -> Path:
        """Move an unpacked, verified package into ``<model>/<version>`` atomically.

        ``unpacked`` must be on the same filesystem (the store's staging directory), so the
        final step is one rename. An existing install of the same version is kept as it is:
        installed releases are immutable.
        """
        target_parent = self.root / check_name(model)
        target = target_parent / check_version(version)
        target_parent.mkdir(exist_ok=True)
        if target.exists():
            shutil.rmtree(unpacked, ignore_errors=True)
            return target
        fsync_tree(unpacked)
        os.rename(unpacked, target)
        fsync_dir(target_parent)
        fsync_dir(unpacked.parent)
        return target

    def set_current(self, model: str, version: str | None) -> None:
        """Point ``current`` at ``version`` (None removes it) by renaming a new link over it."""
        directory = self.root / check_name(model)
        link = directory / "current"
        if version is None:
            if link.is_symlink():
                link.unlink()
                fsync_dir(directory)
            return
        if not (directory / check_version(version)).is_dir():
            raise StoreError(f"{model} {version} is not installed; cannot make it current")
        tmp = directory / ".current.tmp"
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        os.symlink(version, tmp)
        os.replace(tmp, link)
        fsync_dir(directory)

    def raise_floor(self, model: str, version: str, serial: int) -> None:
        """Record a committed release: ``serial`` becomes the floor (the next release must carry
        a higher one; a lower serial never lowers it) and ``version`` the committed version —
        older than the one before it when the release was a signed rollback.

        The serial is written first: a crash between the two writes leaves the release counted
        as committed (``recover``), and the version record follows at the next commit.
        """
        old = self.serial_floor(check_name(model))
        if old is not None and old >= serial:
            return
        serials = self._serials()
        serials[model] = serial
        write_json_atomic(self.root / "serials.json", serials)
        floors = self._floors()
        floors[model] = check_version(version)
        write_json_atomic(self.root / "floors.json", floors)

    def reset_floor(self, model: str, version: str) -> None:
        """Set the floor to exactly ``version``, lower or not: only for a root-signed reset
        (recovery from a leaked release key). The serial floor is forgotten (the attacker's
        serial with it), so until the next commit the version floor applies; the version is no
        longer remembered as bad."""
        serials = self._serials()
        if serials.pop(check_name(model), None) is not None:
            write_json_atomic(self.root / "serials.json", serials)
        floors = self._floors()
        floors[check_name(model)] = check_version(version)
        write_json_atomic(self.root / "floors.json", floors)
        bad = self._bad()
        if version in bad.get(model, []):
            bad[model] = [v for v in bad[model] if v != version]
            write_json_atomic(self.root / "bad.json", bad)

    def mark_bad(self, model: str, version: str) -> None:
        bad = self._bad()
        versions = set(bad.get(check_name(model), []))
        versions.add(check_version(version))
        bad[model] = sorted(versions, key=version_tuple)
        write_json_atomic(self.root / "bad.json", bad)

    def begin(self, pending: PendingInstall) -> None:
        existing = self.pending()
        if existing is not None:
            raise StoreError(
                f"an install of {existing.model} {existing.version} is still pending "
                f"(step {existing.step}); run recover() first"
            )
        self._write_pending(pending)

    def advance(self, pending: PendingInstall, step: str) -> None:
        if step not in STEPS:
            raise StoreError(f"unknown install step {step!r} (steps: {', '.join(STEPS)})")
        pending.step = step
        self._write_pending(pending)

    def clear_pending(self) -> None:
        path = self.root / "pending.json"
        if path.exists():
            path.unlink()
            fsync_dir(self.root)

    def remove(self, model: str, version: str) -> None:
        """Delete an installed release that is not current (rename away first, then delete)."""
        if self.current(model) == version:
            raise StoreError(f"{model} {version} is current; switch away before removing it")
        path = self.root / check_name(model) / check_version(version)
        if not path.is_dir():
            return
        trash = path.with_name(f".trash-{version}-{os.getpid()}")
        os.rename(path, trash)
        fsync_dir(path.parent)
        shutil.rmtree(trash, ignore_errors=True)

    def gc(self, model: str, keep: int) -> list[str]:
        """Keep the current release and the ``keep`` newest others below it; delete the rest."""
        current = self.current(model)
        pending = self.pending()
        protected = {current}
        if pending is not None and pending.model == model:
            protected |= {pending.version, pending.previous}
        versions = [v for v in self.versions(model) if v != current]
        below = [
            v for v in versions if current is None or version_tuple(v) < version_tuple(current)
        ]
        above = [v for v in versions if v not in below]  # releases that were rolled back
        newest_first = sorted(below, key=version_tuple, reverse=True)
        doomed = [v for v in newest_first[keep:] + above if v not in protected]
        for version in doomed:
            self.remove(model, version)
        self._sweep_hidden(self.root / model)
        return sorted(doomed, key=version_tuple)

    def recover(self) -> Recovery | None:
        """Finish or undo the install a crash interrupted; call before anything loads a model.

        A release whose floor was already raised had passed its health gate, so the install is
        finished. Anything earlier is undone: ``current`` goes back to the previous release and
        the new one is deleted. A crash while the new model was being loaded or checked
        (step ``activating``) may have been caused by that model, so it is also marked bad
        instead of being retried forever; a crash at any other step says nothing about the
        release, and its re-delivery installs it again.
        """
        self._sweep_staging()
        pending = self.pending()
        if pending is None:
            return None
        floor = self.serial_floor(pending.model)
        committed = pending.serial > 0 and floor is not None and floor >= pending.serial
        if committed and (self.root / pending.model / pending.version).is_dir():
            self.set_current(pending.model, pending.version)
            self.clear_pending()
            return Recovery(pending, "committed", "restart after the floor was raised")
        if self.current(pending.model) != pending.previous:
            self.set_current(
                pending.model,
                pending.previous if pending.previous in self.versions(pending.model) else None,
            )
        if pending.version != pending.previous:
            self.remove(pending.model, pending.version)
        reason = f"interrupted at step {pending.step!r}"
        if pending.step == "activating":
            self.mark_bad(pending.model, pending.version)
            reason += "; marked bad (the crash happened while the new model was loading)"
        elif pending.step == "canary":  # it had passed its load and golden check
            reason += "; its canary had no verdict, so it was never committed (not marked bad)"
        self.clear_pending()
        self._sweep_hidden(self.root / pending.model)
        return Recovery(pending, "rolled_back", reason)

    # --- internals -----------------------------------------------------------------------
    def _write_pending(self, pending: PendingInstall) -> None:
        check_name(pending.model)
        check_version(pending.version)
        write_json_atomic(self.root / "pending.json", asdict(pending))

    def _floors(self) -> dict[str, str]:
        return dict(_read_json(self.root / "floors.json", {}))

    def _serials(self) -> dict[str, int]:
        return dict(_read_json(self.root / "serials.json", {}))

    def _bad(self) -> dict[str, list[str]]:
        return dict(_read_json(self.root / "bad.json", {}))

    def _sweep_hidden(self, directory: Path) -> None:
        """Delete leftovers of interrupted renames (``.trash-*``, ``.current.tmp``)."""
        if not directory.is_dir():
            return
        for path in _hidden(directory):
            if path.is_symlink() or path.is_file():
                path.unlink()
            else:
                shutil.rmtree(path, ignore_errors=True)

    def _sweep_staging(self) -> None:
        """Unpack directories are worthless after a restart; downloads are kept for resuming
        (the re-delivered release continues where it stopped) unless a day old, so releases
        that never come back cannot fill the disk."""
        stale = time.time() - STAGING_MAX_AGE_S
        for path in self.staging.iterdir():
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            elif path.lstat().st_mtime < stale:
                path.unlink()


def _hidden(directory: Path) -> Iterator[Path]:
    for path in directory.iterdir():
        if path.name.startswith((".trash-", ".current.tmp")):
            yield path
