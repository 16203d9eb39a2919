"""What a device tells the hub about its updates: progress events, outcomes, the state report.

Two kinds of message, following AWS IoT Jobs' execution status model:

- *events* (``…/events``, QoS 1, not retained): one per step of an install, each carrying the
  ``deployment_id`` so the hub can tell a replayed release from the one it just published;
  the last event of an install has ``"result"`` set — ``succeeded``, ``failed`` (rolled back) or
  ``refused`` (nothing was changed) — and a machine-readable ``code`` with a human ``message``;
- the *state report* (``…/state``, QoS 1, retained): the device's current picture — models and
  their versions, the last update outcome, governor state — rebuilt from its sources whenever
  something changes, so ``edgeagent hub status`` reads the fleet from retained messages alone.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from edgeagent import __version__
from edgeagent.fsutil import write_json_atomic

log = logging.getLogger(__name__)

Publish = Callable[[dict[str, Any]], None]
RESULTS = ("succeeded", "failed", "refused")


class UpdateReporter:
    """Builds the events and the state report and hands them to the MQTT link (if any)."""

    def __init__(
        self,
        device_id: str,
        group: str,
        *,
        sources: Mapping[str, Callable[[], dict[str, Any]]] | None = None,
        metrics: CollectorRegistry | None = None,
        state_file: Path | None = None,
    ) -> None:
        self.device_id = device_id
        self.group = group
        self.sources = dict(sources or {})
        self.publish_state: Publish = lambda state: None
        self.publish_event: Publish = lambda event: None
        self.current: dict[str, Any] = {"state": "idle"}  # the install in progress, if any
        self.last: dict[str, Any] | None = None  # the last finished install or refusal
        self.history: list[dict[str, Any]] = []  # recent outcomes, newest last
        self.state_file = state_file  # outcomes survive restarts, so the report stays true
        if state_file is not None and state_file.is_file():
            with contextlib.suppress(OSError, ValueError, AttributeError):
                saved = json.loads(state_file.read_text(encoding="utf-8"))
                self.last, self.history = saved.get("last"), list(saved.get("history", []))
        self._outcomes = Counter(
            "edgeagent_update_outcomes",
            "Model update attempts by result (succeeded, failed, refused) and reason code",
            ["result", "code"],
            registry=metrics,
        )

    def connect(self, publish_state: Publish, publish_event: Publish) -> None:
        self.publish_state = publish_state
        self.publish_event = publish_event
        self.refresh()

    def progress(self, release: Mapping[str, str], step: str, **detail: Any) -> None:
        """An install reached ``step`` (verified, downloading, unpacked, installed, …)."""
        event = {**release, "step": step, **detail, "at": time.time()}
        self.current = {"state": step, **release, **detail}
        self.publish_event({"device_id": self.device_id, **event})
        if step != "downloading":  # byte counts go out as events only, not as state churn
            self.refresh()

    def outcome(
        self,
        release: Mapping[str, str],
        result: str,
        code: str,
        message: str,
        *,
        persist: bool = True,
        details: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The install ended: ``result`` is one of RESULTS; ``code`` says why, for machines;
        ``details`` are JSON-ready figures beside the message (a canary's ``canary`` table).

        ``persist=False`` (refused junk: bytes no trusted key signed) reports the event and
        counts it, but leaves the saved history and the retained state alone, so a flood of
        junk costs no disk writes and cannot push real outcomes out of the history.
        """
        if result not in RESULTS:
            raise ValueError(f"result must be one of {RESULTS}, got {result!r}")
        record = {
            **release,
            **(details or {}),
            "result": result,
            "code": code,
            "message": message,
            "at": time.time(),
        }
        log.log(
            logging.INFO if result == "succeeded" else logging.WARNING,
            "update %s %s %s: %s (%s) %s",
            release.get("model", "?"),
            release.get("version", "?"),
            result,
            code,
            release.get("deployment_id", ""),
            message,
        )
        self._outcomes.labels(result, code).inc()
        if not persist:
            self.publish_event({"device_id": self.device_id, "step": "done", **record})
            return record
        self.current = {"state": "idle"}
        self.last = record
        self.history = [*self.history[-9:], record]
        if self.state_file is not None:
            write_json_atomic(self.state_file, {"last": self.last, "history": self.history})
        self.publish_event({"device_id": self.device_id, "step": "done", **record})
        self.refresh()
        return record

    def status(self) -> dict[str, Any]:
        """The "updates" part of /v1/status."""
        return {"current": self.current, "last": self.last, "history": self.history}

    def state(self) -> dict[str, Any]:
        """The retained state report: who this is, what it serves, how its updates went."""
        report: dict[str, Any] = {
            "device_id": self.device_id,
            "group": self.group,
            "agent_version": __version__,
            "online": True,
            "updated_at": time.time(),
            "updates": self.status(),
        }
        for key, source in self.sources.items():
            if key in report:  # sources add to the report, never replace its own fields
                continue
            try:
                report[key] = source()
            except Exception as exc:  # a broken source must not stop the report
                report[key] = {"error": str(exc)}
        return report

    def refresh(self) -> None:
        self.publish_state(self.state())
