"""The A/B install root: one directory per agent version, ``current`` and ``previous`` links.

::

    <root>/versions/<version>/venv/   one self-contained venv per version (its own wheels)
    <root>/current  -> versions/<v>   what the service runs (ExecStart=<root>/current/venv/...)
    <root>/previous -> versions/<u>   the version to come back to
    <root>/boot-check                 the start-up check (ExecStartPre), see ``boot``
    <root>/pending.json, committed.json, outcome.json   (``state``)

Links are switched by creating the new link under a temporary name and renaming it over the old
one (``rename(2)`` is atomic), then fsyncing the root, so a power cut leaves the old target or
the new one. The agent's state directory, models, keys and config live elsewhere and are never
touched by a switch: both versions read the same ones.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Collection
from pathlib import Path

from edgeagent.fsutil import fsync_dir, write_text_atomic

_VERSION_DIR_RE = re.compile(r"\A[0-9]{1,9}(\.[0-9]{1,9}){0,2}\Z", re.ASCII)
MARKER = "installed.json"  # written last: a version directory without it is unfinished

# Runs before every start. Shell, not Python: it only picks which version's code judges the
# start — the known-good one (``previous``) while a switch is on trial — so a new version that
# cannot even import is judged by the old one. ``exec`` keeps the exit status.
BOOT_SCRIPT = """#!/bin/sh
# edgeagent boot check (written by 'edgeagent agent-update init'; ExecStartPre of the service).
root="$(dirname "$(readlink -f "$0")")"
if [ -e "$root/pending.json" ] && [ -x "$root/previous/venv/bin/python" ]; then
    py="$root/previous/venv/bin/python"
else
    py="$root/current/venv/bin/python"
fi
exec "$py" -m edgeagent.selfupdate.boot --root "$root"
"""


class LayoutError(RuntimeError):
    """The root is not an A/B layout this code can work with (the message says why)."""


class Layout:
    """Paths and link switches under one install root."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.versions = self.root / "versions"
        self.current_link = self.root / "current"
        self.previous_link = self.root / "previous"
        self.boot_script = self.root / "boot-check"

    def version_dir(self, version: str) -> Path:
        if not _VERSION_DIR_RE.match(version):
            raise LayoutError(f"{version!r} is not a version (MAJOR.MINOR.PATCH)")
        return self.versions / version

    def venv(self, version: str) -> Path:
        return self.version_dir(version) / "venv"

    def executable(self, version: str) -> Path:
        return self.venv(version) / "bin" / "edgeagent"

    def _target(self, link: Path) -> str | None:
        """The version a link points at, or None (absent, or not into versions/)."""
        try:
            target = os.readlink(link)
        except (FileNotFoundError, OSError):
            return None
        name = Path(target).name
        return name if _VERSION_DIR_RE.match(name) else None

    def current(self) -> str | None:
        return self._target(self.current_link)

    def previous(self) -> str | None:
        return self._target(self.previous_link)

    def _dirs(self) -> list[str]:
        if not self.versions.is_dir():
            return []
        found = [p.name for p in self.versions.iterdir() if _VERSION_DIR_RE.match(p.name)]
        return sorted(found, key=lambda v: tuple(int(part) for part in v.split(".")))

    def installed(self) -> list[str]:
        """Every completely installed version (``installed.json`` written), oldest first."""
        return [v for v in self._dirs() if (self.versions / v / MARKER).is_file()]

    def point(self, link: Path, version: str) -> None:
        """Make ``link`` name ``versions/<version>`` in one rename (relative: the root may move)."""
        if not (self.version_dir(version) / "venv").is_dir():
            raise LayoutError(f"{self.version_dir(version)} has no venv; install it first")
        temporary = link.with_name(f".{link.name}.new")
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
        os.symlink(Path("versions") / version, temporary)
        os.replace(temporary, link)
        fsync_dir(self.root)

    def switch(self, version: str, checkpoint=lambda name: None) -> None:
        """``previous`` → what ``current`` names now, then ``current`` → ``version``.

        Two renames; a crash between them leaves both naming the old version (consistent: the
        old version runs, and the pending switch is rolled forward by ``boot``).
        """
        old = self.current()
        if old is not None and old != version:
            self.point(self.previous_link, old)
        checkpoint("agent_switched_previous")
        self.point(self.current_link, version)

    def adopt(self, version: str) -> None:
        """Make a fresh root: ``current`` → ``version`` (already installed) and the boot script."""
        self.point(self.current_link, version)
        write_text_atomic(self.boot_script, BOOT_SCRIPT, mode=0o755)

    def prune(self, keep: int, bad: Collection[str] = ()) -> list[str]:
        """Delete unfinished installs, the ``bad`` versions (they failed their switch and are
        never tried again) and all but the ``keep`` newest good versions, never the ones
        ``current`` or ``previous`` name; return the versions deleted.

        After a rollback ``previous`` names the version that is current again, so the good
        version before it is protected by nothing but this order: a failed version must never
        take its place."""
        protected = {self.current(), self.previous()}
        installed = self.installed()
        mine = [v for v in self._dirs() if v not in protected]
        unfinished = [v for v in mine if v not in installed]
        failed = [v for v in mine if v in installed and v in bad]
        spare = [v for v in mine if v in installed and v not in bad]
        room = max(0, keep - len(protected - {None}))
        doomed = unfinished + failed + spare[: max(0, len(spare) - room)]
        for version in doomed:
            shutil.rmtree(self.version_dir(version), ignore_errors=True)
        if doomed:
            fsync_dir(self.versions)
        return doomed
