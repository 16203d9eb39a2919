"""The on-disk spool of camera events: what the broker has not acknowledged survives an outage
(and a restart of the agent), bounded in count and bytes.

One file per event (``<sequence>.json``, written atomically), so an event is either wholly
there or not at all after a power cut; the sender publishes the oldest first and deletes its
file only after the broker's PUBACK, so each event is delivered once its broker is back (at
least once by MQTT's rules; each event carries an ``id`` for a consumer that must be sure).
When the spool is full the oldest events are dropped first and counted.
"""

from __future__ import annotations

import json
import logging
import threading
from collections import deque
from pathlib import Path
from typing import Any

from edgeagent.fsutil import write_file_atomic

log = logging.getLogger(__name__)
SUFFIX = ".json"


class EventSpool:
    """A directory of pending events, oldest first."""

    def __init__(self, directory: Path, max_events: int, max_bytes: int) -> None:
        self.directory = directory
        self.max_events = max_events
        self.max_bytes = max_bytes
        self.dropped = 0  # events pushed out by newer ones while the broker was away
        self._lock = threading.Lock()
        directory.mkdir(parents=True, exist_ok=True)
        self._files: deque[tuple[int, int]] = deque()  # (sequence, size)
        for path in sorted(directory.glob(f"*{SUFFIX}")):
            if path.stem.isdigit():
                self._files.append((int(path.stem), path.stat().st_size))
            else:
                path.unlink(missing_ok=True)
        for stray in directory.glob(".*"):  # a write cut short by a crash
            stray.unlink(missing_ok=True)
        self._next = self._files[-1][0] + 1 if self._files else 1
        self._bytes = sum(size for _, size in self._files)

    def __len__(self) -> int:
        return len(self._files)

    def append(self, topic: str, payload: dict[str, Any]) -> None:
        """Keep one event for ``topic``; the oldest go when over the count or byte budget."""
        data = json.dumps({"topic": topic, "payload": payload}, default=str).encode()
        with self._lock:
            sequence, self._next = self._next, self._next + 1
            write_file_atomic(self._path(sequence), data, mode=0o600)
            self._files.append((sequence, len(data)))
            self._bytes += len(data)
            while len(self._files) > 1 and (
                len(self._files) > self.max_events or self._bytes > self.max_bytes
            ):
                self._remove_first()
                self.dropped += 1
                if self.dropped in (1, 10, 100) or self.dropped % 1000 == 0:
                    log.warning("event spool full: %d event(s) dropped so far", self.dropped)

    def oldest(self) -> tuple[int, str, bytes] | None:
        """(sequence, topic, payload) of the oldest pending event, None when empty."""
        with self._lock:
            while self._files:
                sequence = self._files[0][0]
                try:
                    record = json.loads(self._path(sequence).read_bytes())
                    return sequence, str(record["topic"]), json.dumps(record["payload"]).encode()
                except (OSError, ValueError, KeyError, TypeError):  # unreadable: not deliverable
                    log.warning("event spool: dropping unreadable %s", self._path(sequence))
                    self._remove_first()
                    self.dropped += 1
            return None

    def remove(self, sequence: int) -> None:
        """The broker has event ``sequence``: forget it."""
        with self._lock:
            if self._files and self._files[0][0] == sequence:
                self._remove_first()

    def status(self) -> dict[str, Any]:
        return {"pending": len(self._files), "bytes": self._bytes, "dropped": self.dropped}

    def _remove_first(self) -> None:
        sequence, size = self._files.popleft()
        self._bytes -= size
        self._path(sequence).unlink(missing_ok=True)

    def _path(self, sequence: int) -> Path:
        return self.directory / f"{sequence:012d}{SUFFIX}"
