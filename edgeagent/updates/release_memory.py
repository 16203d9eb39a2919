"""What the updater remembers of releases: the hints waiting, the envelopes handled, the one
committed per model. State and its own two files only; no verification, no install.

Kept apart from the install steps, as python-tuf keeps its trusted metadata apart from its
updater: these are the rules that decide whether an envelope is news, and each is small enough
to read in one go.

- Hints: release envelopes waiting for the worker, newest per topic. A burst on one topic
  (junk or a re-publish) replaces what waited there and can never push out another topic's.
- Handled: accepted envelopes (trust rotations and committed releases), so a re-delivered one
  is answered quietly instead of reinstalled; remembered per purpose, the last ``REMEMBERED``.
- Committed: the envelope committed last per model. A newer commit supersedes it: the old
  one is forgotten as handled, because it is a replay now (below the floor), and a replay is
  refused and reported, not silently skipped.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

from edgeagent.fsutil import write_json_atomic

REMEMBERED = 64  # accepted envelopes remembered, so a re-delivered one is ignored quietly


def handled_key(purpose: str, envelope: bytes) -> str:
    """Accepted envelopes are remembered per purpose: bytes applied as a trust rotation say
    nothing about the same bytes as a release, and vice versa."""
    return f"{purpose}:{hashlib.sha256(envelope).hexdigest()}"


class ReleaseMemory:
    """The hint queue (in memory) and the handled and committed envelopes (``handled.json``,
    ``committed-envelopes.json`` under ``root``)."""

    def __init__(self, root: Path) -> None:
        self._hints: dict[str, bytes] = {}
        self._hint_ready = asyncio.Event()
        self._handled_path = root / "handled.json"
        self._handled: list[str] = self._load_handled()
        self._committed_path = root / "committed-envelopes.json"
        self._committed: dict[str, str] = self._load_committed()

    # --- hints ---------------------------------------------------------------------------
    def hint(self, topic: str, envelope: bytes) -> None:
        """Queue ``envelope``, replacing what waited on ``topic``."""
        self._hints.pop(topic, None)  # re-insert: the topic moves to the back of the line
        self._hints[topic] = envelope
        self._hint_ready.set()

    async def next_hint(self) -> tuple[str, bytes]:
        """Wait for the oldest topic's hint and take it."""
        await self._hint_ready.wait()
        topic = next(iter(self._hints))
        envelope = self._hints.pop(topic)
        if not self._hints:
            self._hint_ready.clear()
        return topic, envelope

    @property
    def queued(self) -> int:
        return len(self._hints)

    # --- handled and committed envelopes -------------------------------------------------
    def handled(self, key: str) -> bool:
        return key in self._handled

    def remember(self, key: str) -> None:
        if key in self._handled:
            return
        self._handled = [*self._handled, key][-REMEMBERED:]
        write_json_atomic(self._handled_path, self._handled)

    def supersede(self, model: str, key: str) -> None:
        """Forget the envelope committed before for ``model``: it is a replay now (its serial
        is below the floor), and a replay is refused and reported, not silently skipped."""
        old = self._committed.get(model)
        if old == key:
            return
        if old in self._handled:
            self._handled = [k for k in self._handled if k != old]
            write_json_atomic(self._handled_path, self._handled)
        self._committed[model] = key
        write_json_atomic(self._committed_path, self._committed)

    def _load_handled(self) -> list[str]:
        try:
            data = json.loads(self._handled_path.read_text(encoding="utf-8"))
            return [str(d) for d in data][-REMEMBERED:]
        except (OSError, ValueError, TypeError):
            return []

    def _load_committed(self) -> dict[str, str]:
        try:
            data = json.loads(self._committed_path.read_text(encoding="utf-8"))
            return {str(m): str(k) for m, k in data.items()}
        except (OSError, ValueError, TypeError, AttributeError):
            return {}
