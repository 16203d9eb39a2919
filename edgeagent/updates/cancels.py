"""The cancellations a device holds, and the check every release passes before it installs.

A cancellation (``fleet.cancel``) arrives on the device's release topic behind the release it
covers — an offline device's persistent session holds both, in that order — so it is applied
the moment it arrives, not queued behind the release: the updater asks ``refusal`` when it
verifies a release and again just before the install step (a cancellation that arrived while
the artifacts downloaded still stops it). Cancellations are kept in ``<store>/cancelled.json``
until they expire, so a restart between the two messages changes nothing; at most
``[updates] max_cancellations`` are kept (the ones expiring last), a bound against a flood.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from edgeagent.fleet.cancel import Cancellation, verify_cancellation
from edgeagent.fleet.manifest import ReleaseManifest
from edgeagent.fleet.signing import Refused, TrustError, format_time, parse_time
from edgeagent.fleet.trust import TrustStore
from edgeagent.fsutil import write_json_atomic

log = logging.getLogger(__name__)


class Cancellations:
    """The held cancellations (module docstring), persisted on every change."""

    def __init__(self, path: Path, limit: int) -> None:
        self.path = path
        self.limit = limit
        self._held: list[Cancellation] = self._load()

    def receive(self, envelope: bytes, trust: TrustStore) -> Cancellation | None:
        """Verify a cancellation and hold it; a refused one is logged and changes nothing
        (it can only ever stop installs, so a forged one is worth no more than a warning)."""
        try:
            cancellation = verify_cancellation(envelope, trust)
        except TrustError as exc:
            log.warning("ignored a cancellation (%s): %s", exc.code, exc.message)
            return None
        now = datetime.now(timezone.utc)
        held = [c for c in self._held if c.expires > now and c != cancellation]
        held.append(cancellation)
        held.sort(key=lambda c: c.expires)
        self._held = held[-self.limit :] if self.limit > 0 else []
        write_json_atomic(self.path, [_dump(c) for c in self._held])
        log.info(
            "deployment %s of %s (serials up to %d) cancelled by the hub",
            cancellation.deployment_id,
            cancellation.model,
            cancellation.serial,
        )
        return cancellation

    def refusal(self, manifest: ReleaseManifest) -> Refused | None:
        """The refusal of ``manifest`` when a held cancellation covers it, else None."""
        for cancellation in self._held:
            if cancellation.covers(manifest):
                return cancellation.refusal(manifest)
        return None

    def status(self) -> list[dict[str, Any]]:
        return [_dump(c) for c in self._held]

    def _load(self) -> list[Cancellation]:
        """What was held before a restart; an unreadable file is logged and read as empty (the
        hub's cancellations were verified when they arrived, so nothing unsafe comes in)."""
        try:
            rows = json.loads(self.path.read_text(encoding="utf-8"))
            return [_load_one(row) for row in rows]
        except FileNotFoundError:
            return []
        except (OSError, ValueError, TypeError, KeyError, TrustError) as exc:
            log.warning("%s: unreadable (%s); holding no cancellation", self.path, exc)
            return []


def _dump(cancellation: Cancellation) -> dict[str, Any]:
    return {
        "model": cancellation.model,
        "deployment_id": cancellation.deployment_id,
        "serial": cancellation.serial,
        "issued_at": format_time(cancellation.issued_at),
        "expires": format_time(cancellation.expires),
        "reason": cancellation.reason,
    }


def _load_one(row: dict[str, Any]) -> Cancellation:
    return Cancellation(
        model=str(row["model"]),
        deployment_id=str(row["deployment_id"]),
        serial=int(row["serial"]),
        issued_at=parse_time(row["issued_at"], "issued_at"),
        expires=parse_time(row["expires"], "expires"),
        reason=str(row.get("reason", "")),
    )
