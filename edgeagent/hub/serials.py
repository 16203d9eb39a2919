"""The hub's release serials: one counter per model, persisted beside the release keys.

Devices refuse any release whose serial is not above the one they committed last, so the
counter must never hand out a number twice — even across crashes. ``next()`` therefore writes
the new value (atomically, fsynced) *before* the caller signs anything with it: a crash after
that wastes a number, which is harmless, while a reused one would make a device refuse a
genuine release as ``same_version``. The hub server keeps its own counter per model in its
database (table ``model_serials``, ``hub.server.releasedb.next_serial``) with the same rule: the
number is committed in the transaction that records what will be sent, before anything signed
with it is sent, and it stays above every serial the server received in an upload.
"""

from __future__ import annotations

import json
from pathlib import Path

from edgeagent.fleet.manifest import MAX_SERIAL
from edgeagent.fsutil import write_json_atomic
from edgeagent.hub.keys import HubError
from edgeagent.models.names import NAME_RE

SERIALS_FILE = "serials.json"


def serials_path_for(key_path: str | Path) -> Path:
    """Where the counters live by default: beside the (first) release key."""
    return Path(key_path).parent / SERIALS_FILE


class ReleaseSerials:
    """``{model: last serial}`` in one JSON file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def _read(self) -> dict[str, int]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise HubError(f"{self.path}: unreadable release serials ({exc})") from exc
        if not isinstance(data, dict) or not all(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_SERIAL
            for v in data.values()
        ):
            raise HubError(f"{self.path}: must map model names to serials (0..2^53-1)")
        return data

    def last(self, model: str) -> int:
        """The serial signed last for ``model`` (0 before its first release)."""
        return self._read().get(model, 0)

    def next(self, model: str) -> int:
        """Reserve and persist the next serial of ``model``."""
        if not NAME_RE.match(model):
            raise HubError(f"model name {model!r} is not 1-64 letters, digits, '_', '-' or '.'")
        data = self._read()
        serial = data.get(model, 0) + 1
        if serial > MAX_SERIAL:
            raise HubError(f"{self.path}: {model} has used every serial")
        data[model] = serial
        write_json_atomic(self.path, data)
        return serial
