"""The switch's records under the install root, each replaced atomically and fsynced.

``pending.json``   a switch on trial: from/to version, serial, the models that served before,
                   the boot counter, the deadline, and a verdict once the new version failed.
                   Its mere existence is what the shell boot script tests.
``committed.json`` the committed agent release (version, serial: the anti-rollback floor) and
                   the versions that failed their switch here (never tried again).
``outcome.json``   what happened to a switch that the running agent did not see end (a
                   rollback done by the boot check, a commit finished by it): reported to the
                   hub at the next start, then deleted.

They are tiny JSON files read by both the old and the new version of the agent, so the format
only ever gains optional keys; a file that cannot be read is an error naming it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from edgeagent.fsutil import fsync_dir, write_json_atomic

MAX_BAD_VERSIONS = 64


class StateError(RuntimeError):
    """A record under the root that cannot be read (the message names the file)."""


def read_record(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when it is absent, StateError naming it when it
    cannot be read or is not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise StateError(f"{path}: unreadable ({exc})") from exc
    if not isinstance(data, dict):
        raise StateError(f"{path}: must hold a JSON object")
    return data


def _remove(path: Path) -> None:
    try:
        path.unlink()
    except FileNotFoundError:
        return
    fsync_dir(path.parent)


@dataclass(frozen=True)
class PendingSwitch:
    from_version: str
    to_version: str
    serial: int
    deployment_id: str
    deadline: float  # wall-clock seconds: uncommitted by then is a failure
    max_boots: int  # starts of the new version allowed before it must have committed
    models: tuple[str, ...] = ()  # served (READY) before the switch: must serve after it
    boots: int = 0
    verdict: str = ""  # "<code>: <message>" once the trial failed; the boot check rolls back

    @property
    def release(self) -> dict[str, str]:
        """As the update reports name a release."""
        return {
            "model": "edgeagent",
            "version": self.to_version,
            "deployment_id": self.deployment_id,
        }

    def failed(self, code: str, message: str) -> PendingSwitch:
        return replace(self, verdict=f"{code}: {message}")


@dataclass
class AgentRecord:
    """``committed.json``: the anti-rollback floor and the known-bad versions (AgentHistory)."""

    version: str | None = None
    serial: int | None = None
    bad: list[str] = field(default_factory=list)

    def serial_floor(self) -> int | None:
        return self.serial

    def bad_versions(self) -> set[str]:
        return set(self.bad)


class SwitchState:
    """Reads and writes the three records of one root."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.pending_path = self.root / "pending.json"
        self.record_path = self.root / "committed.json"
        self.outcome_path = self.root / "outcome.json"

    # --- pending ---------------------------------------------------------------------
    def pending(self) -> PendingSwitch | None:
        data = read_record(self.pending_path)
        if data is None:
            return None
        try:
            data["models"] = tuple(data.get("models", ()))
            known = PendingSwitch.__dataclass_fields__
            return PendingSwitch(**{k: v for k, v in data.items() if k in known})
        except TypeError as exc:
            raise StateError(f"{self.pending_path}: {exc}") from exc

    def write_pending(self, pending: PendingSwitch) -> None:
        write_json_atomic(self.pending_path, {**asdict(pending), "models": list(pending.models)})

    def clear_pending(self) -> None:
        _remove(self.pending_path)

    # --- committed record ------------------------------------------------------------
    def record(self) -> AgentRecord:
        data = read_record(self.record_path) or {}
        bad = data.get("bad", [])
        serial = data.get("serial")
        if not isinstance(bad, list) or not (serial is None or isinstance(serial, int)):
            raise StateError(f"{self.record_path}: bad or serial has the wrong type")
        return AgentRecord(version=data.get("version"), serial=serial, bad=[str(b) for b in bad])

    def commit(self, version: str, serial: int) -> None:
        record = self.record()
        record.version, record.serial = version, serial
        record.bad = [b for b in record.bad if b != version]
        write_json_atomic(self.record_path, asdict(record))

    def mark_bad(self, version: str) -> None:
        record = self.record()
        if version not in record.bad:
            record.bad = [*record.bad, version][-MAX_BAD_VERSIONS:]
            write_json_atomic(self.record_path, asdict(record))

    # --- outcome for the next start --------------------------------------------------
    def leave_outcome(self, release: dict[str, str], result: str, code: str, message: str) -> None:
        document = {"release": release, "result": result, "code": code, "message": message}
        write_json_atomic(self.outcome_path, document)

    def take_outcome(self) -> dict[str, Any] | None:
        """The outcome left behind, removed as it is taken (reported once)."""
        data = read_record(self.outcome_path)
        if data is not None:
            os.unlink(self.outcome_path)
        return data
