"""What a device tells the hub about its updates: progress events, outcomes, the state report.

Two kinds of message, following AWS IoT Jobs' execution status model, both typed in
``fleet.messages`` (this module is their one writer on the device):

- *events* (``…/events``, QoS 1, not retained): one per step of an install, each carrying the
  ``deployment_id`` so the hub can tell a replayed release from the one it just published;
  the last event of an install has ``"result"`` set — ``succeeded``, ``failed`` (rolled back) or
  ``refused`` (nothing was changed) — and a machine-readable ``code`` with a human ``message``;
- the *state report* (``…/state``, QoS 1, retained): the device's current picture — models and
  their versions, the last update outcome, governor state — rebuilt from its sources whenever
  something changes, so ``edgeagent hub status`` reads the fleet from retained messages alone.

The sources are the daemon's ``/v1/status`` providers; their shapes are internal and may
change with the code, so each section is mapped field by field into its message type here
(``SECTIONS``), and anything else a provider returns never reaches the wire.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from edgeagent import __version__
from edgeagent.fleet.agent_manifest import this_platform, this_python
from edgeagent.fleet.messages import (
    RESULTS,
    Backend,
    Board,
    DeviceKey,
    Event,
    Governor,
    ModelState,
    Outcome,
    Power,
    Profile,
    Progress,
    StateReport,
    Temperature,
    Traffic,
    Updates,
    encode,
)
from edgeagent.fleet.release_ref import ReleaseRef
from edgeagent.fleet.wire import MessageError, dump, parse
from edgeagent.fsutil import write_json_atomic

log = logging.getLogger(__name__)

Publish = Callable[[dict[str, Any]], None]
HISTORY = 10  # outcomes kept in the report
MESSAGE_CUT = 200  # characters of an outcome's message kept when the report must shrink


def traffic_section(figures: Mapping[str, Any] | None) -> Traffic | None:
    """``ModelStats.traffic()`` of the active version → the model's traffic."""
    if figures is None:
        return None
    return Traffic(
        requests=figures.get("requests", 0),
        errors=figures.get("errors", 0),
        p50_ms=figures.get("p50_ms"),
        p95_ms=figures.get("p95_ms"),
    )


def models_section(status: Mapping[str, Any]) -> dict[str, ModelState]:
    """``ModelRegistry.status()`` → the report's models."""
    return {
        name: ModelState(
            state=info.get("state", ""),
            active_version=info.get("active_version"),
            versions={
                version: Backend(
                    runtime=backend.get("runtime", ""),
                    device=backend.get("device", ""),
                    precision=backend.get("precision", ""),
                )
                for version, backend in info.get("versions", {}).items()
            },
            traffic=traffic_section(
                info.get("versions", {}).get(info.get("active_version"), {}).get("traffic")
            ),
        )
        for name, info in status.items()
    }


def profile_section(report: Mapping[str, Any]) -> Profile:
    """``Accelerators.report()`` → the report's profile."""
    board = report.get("board", {})
    return Profile(
        profile=report.get("profile", ""),
        board=Board(model=board.get("model", ""), arch=board.get("arch", "")),
    )


def governor_section(snapshot: Mapping[str, Any]) -> Governor:
    """``GovernorService.snapshot()`` → the report's governor."""
    return Governor(
        state=snapshot.get("state", ""),
        actions=list(snapshot.get("actions", [])),
        temperatures=[
            Temperature(sensor=zone["sensor"], celsius=zone.get("celsius"))
            for zone in snapshot.get("temperatures", [])
        ],
        power=Power(total_w=snapshot.get("power", {}).get("total_w")),
    )


def device_key_section(status: Mapping[str, Any]) -> DeviceKey:
    """``DeviceKey.status()`` → the report's device key."""
    return DeviceKey(scheme=status.get("scheme", ""), public_key=status.get("public_key", ""))


SECTIONS: dict[str, Callable[[Any], Any]] = {
    "models": models_section,
    "profile": profile_section,
    "governor": governor_section,
    "device_key": device_key_section,
}


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
        max_state_bytes: int = 32 * 1024,
    ) -> None:
        self.device_id = device_id
        self.max_state_bytes = max_state_bytes  # the JSON state report never exceeds this
        self.group = group
        # what agent releases it can install (the hub server targets them by these)
        self.platform, self.python = this_platform(), this_python()
        self.sources = dict(sources or {})
        self.publish_state: Publish = lambda state: None
        self.publish_event: Publish = lambda event: None
        self._current = Progress()  # the install in progress, if any
        self._last: Outcome | None = None  # the last finished install or refusal
        self._history: list[Outcome] = []  # recent outcomes, oldest first
        self.state_file = state_file  # outcomes survive restarts, so the report stays true
        if state_file is not None and state_file.is_file():
            with contextlib.suppress(OSError, ValueError):  # MessageError is a ValueError
                saved = parse(Updates, json.loads(state_file.read_text(encoding="utf-8")), "")
                self._last, self._history = saved.last, saved.history
        self._outcomes = Counter(
            "edgeagent_update_outcomes",
            "Model update attempts by result (succeeded, failed, refused) and reason code",
            ["result", "code"],
            registry=metrics,
        )

    @property
    def last(self) -> dict[str, Any] | None:
        """The last finished install, as the report carries it."""
        return None if self._last is None else dump(self._last)

    def connect(self, publish_state: Publish, publish_event: Publish) -> None:
        self.publish_state = publish_state
        self.publish_event = publish_event
        self.refresh()

    def progress(self, release: ReleaseRef | Mapping[str, str], step: str, **detail: Any) -> None:
        """An install reached ``step`` (verified, downloading, unpacked, installed, …)."""
        ref = ReleaseRef.of(release)
        model, version, deployment_id = ref.model, ref.version, ref.deployment_id
        figures = dict(detail)
        event = Event(
            step,
            device_id=self.device_id,
            model=model,
            version=version,
            deployment_id=deployment_id,
            at=time.time(),
            bytes=figures.pop("bytes", None),
            total=figures.pop("total", None),
            detail=figures,
        )
        self._current = Progress(step, model, version, deployment_id, detail)
        self.publish_event(encode(event))
        if step != "downloading":  # byte counts go out as events only, not as state churn
            self.refresh()

    def outcome(
        self,
        release: ReleaseRef | Mapping[str, str],
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
        ref = ReleaseRef.of(release)  # an agent release still names itself with a dict
        outcome = Outcome(
            result,  # type: ignore[arg-type]  # checked against RESULTS above
            code,
            message,
            model=ref.model,
            version=ref.version,
            deployment_id=ref.deployment_id,
            at=time.time(),
            canary=(details or {}).get("canary"),
        )
        log.log(
            logging.INFO if result == "succeeded" else logging.WARNING,
            "update %s %s %s: %s (%s) %s",
            outcome.model or "?",
            outcome.version or "?",
            result,
            code,
            outcome.deployment_id,
            message,
        )
        self._outcomes.labels(result, code).inc()
        if persist:
            self._current = Progress()
            self._last = outcome
            self._history = [*self._history[1 - HISTORY :], outcome]
            if self.state_file is not None:
                write_json_atomic(
                    self.state_file, dump(Updates(last=outcome, history=self._history))
                )
        self.publish_event(encode(Event.done(self.device_id, outcome)))
        if persist:
            self.refresh()
        return dump(outcome)

    def status(self) -> dict[str, Any]:
        """The "updates" part of /v1/status."""
        updates: dict[str, Any] = dump(Updates(self._current, self._last, self._history))
        return {"last": None, **updates}

    def report(self) -> StateReport:
        """The retained state report: who this is, what it serves, how its updates went."""
        sections: dict[str, Any] = {}
        errors: dict[str, str] = {}
        for key, section in SECTIONS.items():
            source = self.sources.get(key)
            if source is None:
                continue
            try:
                sections[key] = section(source())
            except Exception as exc:  # a broken source must not stop the report
                errors[key] = str(exc) or exc.__class__.__name__
        return StateReport(
            device_id=self.device_id,
            group=self.group,
            agent_version=__version__,
            platform=self.platform,
            python=self.python,
            updated_at=time.time(),
            updates=Updates(self._current, self._last, self._history),
            errors=errors,
            **sections,
        )

    def state(self) -> dict[str, Any]:
        """The state report as the MQTT link publishes it, within ``max_state_bytes``."""
        return bounded(self.report(), self.max_state_bytes)

    def refresh(self) -> None:
        self.publish_state(self.state())


def _size(document: dict[str, Any]) -> int:
    return len(json.dumps(document, default=str).encode())


def _cut(outcome: Outcome | None) -> Outcome | None:
    if outcome is None or len(outcome.message) <= MESSAGE_CUT:
        return outcome
    return dataclasses.replace(outcome, message=outcome.message[:MESSAGE_CUT] + " …")


def _without(report: StateReport, section: str) -> StateReport:
    if section == "models":
        return dataclasses.replace(report, models={})
    if section == "governor":
        return dataclasses.replace(report, governor=None)
    if section == "device_key":
        return dataclasses.replace(report, device_key=None)
    return dataclasses.replace(report, profile=None)


def bounded(report: StateReport, limit: int) -> dict[str, Any]:
    """``report`` encoded in at most ``limit`` bytes of JSON, shrunk in the order that loses
    least: the oldest outcomes of the history first, then long messages, then the big
    sections (models, governor), each omission named in ``errors["report"]``.

    The report is re-published on a heartbeat and retained on the broker for every device,
    so its size must not grow with how many models or how long a refusal's text is; a report
    the broker refuses (over its packet limit) would leave the hub's picture stale instead.
    """
    document = encode(report)
    history = list(report.updates.history)
    while _size(document) > limit and history:
        history = history[1:]
        report = dataclasses.replace(
            report, updates=dataclasses.replace(report.updates, history=history)
        )
        document = encode(report)
    if _size(document) > limit:
        updates = dataclasses.replace(report.updates, last=_cut(report.updates.last))
        report = dataclasses.replace(report, updates=updates)
        document = encode(report)
    left_out: list[str] = []
    for section in ("models", "governor", "device_key", "profile"):
        if _size(document) <= limit:
            break
        left_out.append(section)
        note = f"over max_state_bytes = {limit}: {', '.join(left_out)} left out"
        errors = {**report.errors, "report": note}
        report = dataclasses.replace(_without(report, section), errors=errors)
        document = encode(report)
    if _size(document) > limit:  # the bare identity always fits a sane limit (validated)
        document = encode(
            StateReport(
                device_id=report.device_id,
                group=report.group,
                agent_version=report.agent_version,
                platform=report.platform,
                python=report.python,
                updated_at=report.updated_at,
                errors={"report": f"over max_state_bytes = {limit}: only the identity sent"},
            )
        )
    return document


__all__ = ["SECTIONS", "MessageError", "UpdateReporter", "bounded"]
