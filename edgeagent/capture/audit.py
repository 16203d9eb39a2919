"""The capture audit log: one JSON line per sample captured, refused, uploaded or deleted.

It names samples (id, model, version, reason), never their content, so it stays readable to
the operator while the samples themselves are sealed. Each line is flushed and fsynced before
the act it records is reported done; past ``max_bytes`` the log moves to ``audit.jsonl.1``
(one generation kept), so it cannot fill the disk.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

AUDIT_FILE = "audit.jsonl"
MAX_AUDIT_BYTES = 1024 * 1024


class AuditLog:
    def __init__(self, directory: Path, max_bytes: int = MAX_AUDIT_BYTES) -> None:
        self.path = directory / AUDIT_FILE
        self._max_bytes = max_bytes
        self._lock = threading.Lock()  # the worker thread and the uploader both write

    def record(self, event: str, **fields: Any) -> None:
        line = json.dumps({"at": round(time.time(), 3), "event": event, **fields}) + "\n"
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                if self.path.stat().st_size > self._max_bytes:
                    os.replace(self.path, self.path.with_name(AUDIT_FILE + ".1"))
            except FileNotFoundError:
                pass
            with open(self.path, "a", encoding="utf-8") as log:
                log.write(line)
                log.flush()
                os.fsync(log.fileno())

    def entries(self) -> list[dict[str, Any]]:
        """Every line of the current log, oldest first (``capture status`` and tests read it)."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in text.splitlines() if line.strip()]
