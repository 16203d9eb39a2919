"""The failure of an install step after verification (shared by the updater and its steps)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class InstallFailed(Exception):
    """A step after verification failed; ``code`` is reported, ``bad`` marks the release bad,
    ``details`` (JSON-ready) go into the reported outcome beside the message."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        bad: bool = False,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.bad = bad
        self.details = dict(details or {})
