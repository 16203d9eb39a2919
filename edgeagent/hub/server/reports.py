"""Turn one device message (topic + payload) into the facts the hub stores — or refuse it.

Anything on the broker may be hostile or broken: a payload that is not JSON, a field of the
wrong type, a huge message, a device id that is not one. Each is a ``ReportError`` with a reason
the ingest loop logs and counts; nothing here raises anything else for bad input. The payload
is read by the contract's parser (``fleet.messages``, which ``hub status`` uses too: a wrong
type is refused naming the field); what the hub keeps is trimmed to its column's size here.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from edgeagent.fleet.messages import (
    Backend,
    Event,
    Governor,
    MessageError,
    Profile,
    StateReport,
    decode_availability,
    decode_event,
    decode_state,
)
from edgeagent.hub.rollout import classify

T = TypeVar("T")

DEVICE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$")
KINDS = ("state", "availability", "events")


class ReportError(ValueError):
    """A message the hub skips; the text says why (logged with the topic)."""


@dataclass(frozen=True)
class DeviceMessage:
    """Where a message came from: the device id and the kind, both taken from the topic."""

    device_id: str
    kind: str


@dataclass(frozen=True)
class StateColumns:
    """The columns of ``devices`` that one state report sets."""

    values: dict[str, Any]
    # what goes into the history: governor, temperatures, versions, request counters
    summary: dict[str, Any]
    last: DeviceEvent | None = None  # the last install's outcome, as the report repeats it
    last_at: float | None = None  # when the device says it ended (its own clock)


@dataclass(frozen=True)
class DeviceEvent:
    """One progress or outcome event; ``outcome`` is set for an install's last event."""

    deployment_id: str
    step: str
    result: str
    code: str
    message: str
    outcome: str  # "" until done; then succeeded | failed (rollout.classify)
    detail: dict[str, Any] = field(default_factory=dict)


def parse_topic(topic: str, prefix: str) -> DeviceMessage:
    head = f"{prefix}/device/"
    if not topic.startswith(head):
        raise ReportError("not a device topic")
    parts = topic[len(head) :].split("/")
    if len(parts) != 2 or parts[1] not in KINDS:
        raise ReportError("unknown device topic")
    if not DEVICE_ID.match(parts[0]):
        raise ReportError("device id must be 1-128 letters, digits or ._:@-")
    return DeviceMessage(parts[0], parts[1])


def _text(value: str, limit: int) -> str:
    return value[:limit]


def _number(value: float | None) -> float | None:
    return value if value is not None and abs(value) < 1e12 else None


def _decoded(decode: Callable[[bytes], T], payload: bytes) -> T:
    try:
        return decode(payload)
    except MessageError as exc:
        raise ReportError(str(exc)) from exc


def _models(report: StateReport) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    versions: dict[str, str] = {}
    backends: dict[str, dict[str, str]] = {}
    for name, info in list(report.models.items())[:64]:
        active = info.active_version
        if active is None:
            continue
        versions[name[:128]] = active[:64]
        backend = info.versions.get(active, Backend())
        backends[name[:128]] = {
            "runtime": backend.runtime[:64],
            "device": backend.device[:64],
            "precision": backend.precision[:64],
        }
    return versions, backends


def _count(value: int) -> int | None:
    return value if 0 <= value < 10**15 else None


def _traffic(report: StateReport) -> dict[str, dict[str, float | None]]:
    """Each model's request counters and latency, as the history keeps them for the charts
    (a counter out of range is dropped, so no rate is taken from it)."""
    kept: dict[str, dict[str, float | None]] = {}
    for name, info in list(report.models.items())[:64]:
        traffic = info.traffic
        if traffic is None or info.active_version is None:
            continue
        requests, errors = _count(traffic.requests), _count(traffic.errors)
        if requests is None or errors is None:
            continue
        kept[name[:128]] = {
            "requests": requests,
            "errors": errors,
            "p50_ms": _number(traffic.p50_ms),
            "p95_ms": _number(traffic.p95_ms),
        }
    return kept


def _temperatures(governor: Governor) -> dict[str, float]:
    return {
        zone.sensor[:64]: celsius
        for zone in governor.temperatures[:64]
        if (celsius := _number(zone.celsius)) is not None
    }


def parse_state(payload: bytes) -> StateColumns:
    """The device's retained state report (``fleet.messages.StateReport``), as columns."""
    return state_columns(_decoded(decode_state, payload))


def state_columns(report: StateReport) -> StateColumns:
    """The columns of ``devices`` (and the history row) one state report sets."""
    profile = report.profile or Profile()
    governor = report.governor or Governor()
    last = report.updates.last
    versions, backends = _models(report)
    temperatures = _temperatures(governor)
    values = {
        "group_name": _text(report.group, 128),
        "profile": _text(profile.profile, 128),
        "board": _text(profile.board.model or profile.board.arch, 256),
        "agent_version": _text(report.agent_version, 64),
        "platform": _text(report.platform, 64),
        "python": _text(report.python, 16),
        "models": versions,
        "backends": backends,
        "governor_state": _text(governor.state, 32),
        "temperatures": temperatures,
        "max_temp_c": max(temperatures.values()) if temperatures else None,
        "power_w": _number(governor.power.total_w),
        "update_state": _text(report.updates.current.state, 32) or "idle",
        "last_result": _text(last.result, 32) if last else "",
        "last_code": _text(last.code, 64) if last else "",
        "last_deployment": _text(last.deployment_id, 128) if last else "",
        "reported_at": _number(report.updated_at),
    }
    summary: dict[str, Any] = {
        key: values[key]
        for key in (
            "models",
            "governor_state",
            "temperatures",
            "max_temp_c",
            "power_w",
            "reported_at",
        )
    }
    summary["traffic"] = _traffic(report)
    outcome = None
    if last is not None and last.deployment_id:
        outcome = device_event(Event.done("", last))
    return StateColumns(values, summary, outcome, _number(last.at) if last else None)


def parse_availability(payload: bytes) -> str:
    return _decoded(decode_availability, payload)


def parse_event(payload: bytes) -> DeviceEvent:
    """A progress or outcome event (``fleet.messages.Event``), as the hub stores it."""
    return device_event(_decoded(decode_event, payload))


def device_event(event: Event) -> DeviceEvent:
    outcome = event.outcome
    detail: dict[str, Any] = {
        key: value
        for key, value in (
            ("model", event.model[:256]),
            ("version", event.version[:256]),
            ("bytes", None if event.bytes is None else float(event.bytes)),
            ("total", None if event.total is None else float(event.total)),
            ("message", event.message[:256]),
        )
        if value not in (None, "")
    }
    return DeviceEvent(
        deployment_id=_text(event.deployment_id, 128),
        step=_text(event.step, 32),
        result=event.result or "",
        code=_text(event.code, 64),
        message=_text(event.message, 1000),
        outcome=classify(outcome) if outcome is not None else "",
        detail=detail,
    )
