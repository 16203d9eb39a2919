"""Turn one device message (topic + payload) into the facts the hub stores — or refuse it.

Anything on the broker may be hostile or broken: a payload that is not JSON, a field of the
wrong type, a huge message, a device id that is not one. Each is a ``ReportError`` with a reason
the ingest loop logs and counts; nothing here raises anything else for bad input. Only the
fields the hub keeps are read, each checked for type and trimmed to its column's size.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from edgeagent.hub.rollout import classify

DEVICE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}$")
KINDS = ("state", "availability", "events")
AVAILABILITY = ("online", "offline")


class ReportError(ValueError):
    """A message the hub skips; the text says why (logged with the topic)."""


@dataclass(frozen=True)
class DeviceMessage:
    """Where a message came from: the device id and the kind, both taken from the topic."""

    device_id: str
    kind: str


@dataclass(frozen=True)
class StateReport:
    """The columns of ``devices`` that one state report sets."""

    values: dict[str, Any]
    summary: dict[str, Any]  # what goes into the history (governor, temperatures, versions)
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


def _text(value: Any, limit: int) -> str:
    return value[:limit] if isinstance(value, str) else ""


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if value == value and abs(value) < 1e12 else None  # no NaN/inf


def _table(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _json_object(payload: bytes) -> dict[str, Any]:
    try:
        data = json.loads(payload)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ReportError(f"not JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ReportError(f"expected a JSON object, got {type(data).__name__}")
    return data


def _models(report: dict[str, Any]) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
    versions: dict[str, str] = {}
    backends: dict[str, dict[str, str]] = {}
    for name, info in list(_table(report.get("models")).items())[:64]:
        info = _table(info)
        active = info.get("active_version")
        if not isinstance(name, str) or not isinstance(active, str):
            continue
        versions[name[:128]] = active[:64]
        backend = _table(_table(info.get("versions")).get(active))
        backends[name[:128]] = {
            key: _text(backend.get(key), 64) for key in ("runtime", "device", "precision")
        }
    return versions, backends


def _temperatures(governor: dict[str, Any]) -> dict[str, float]:
    found: dict[str, float] = {}
    zones = governor.get("temperatures")
    for zone in zones[:64] if isinstance(zones, list) else []:
        zone = _table(zone)
        celsius = _number(zone.get("celsius"))
        if isinstance(zone.get("sensor"), str) and celsius is not None:
            found[zone["sensor"][:64]] = celsius
    return found


def _board(profile: dict[str, Any]) -> str:
    board = _table(profile.get("board"))
    return _text(board.get("model"), 256) or _text(board.get("arch"), 256)


def parse_state(payload: bytes) -> StateReport:
    """The device's retained state report (``updates.report.UpdateReporter.state``)."""
    report = _json_object(payload)
    profile = _table(report.get("profile"))
    governor = _table(report.get("governor"))
    updates = _table(report.get("updates"))
    last = _table(updates.get("last"))
    versions, backends = _models(report)
    temperatures = _temperatures(governor)
    values = {
        "group_name": _text(report.get("group"), 128),
        "profile": _text(profile.get("profile"), 128),
        "board": _board(profile),
        "agent_version": _text(report.get("agent_version"), 64),
        "models": versions,
        "backends": backends,
        "governor_state": _text(governor.get("state"), 32),
        "temperatures": temperatures,
        "max_temp_c": max(temperatures.values()) if temperatures else None,
        "power_w": _number(_table(governor.get("power")).get("total_w")),
        "update_state": _text(_table(updates.get("current")).get("state"), 32) or "idle",
        "last_result": _text(last.get("result"), 32),
        "last_code": _text(last.get("code"), 64),
        "last_deployment": _text(last.get("deployment_id"), 128),
        "reported_at": _number(report.get("updated_at")),
    }
    summary = {
        key: values[key]
        for key in ("models", "governor_state", "temperatures", "max_temp_c", "power_w")
    }
    outcome = None
    if last.get("deployment_id") and last.get("result"):
        outcome = parse_event(json.dumps({**last, "step": "done"}).encode())
    return StateReport(values, summary, outcome, _number(last.get("at")))


def parse_availability(payload: bytes) -> str:
    text = payload.decode("utf-8", errors="replace").strip()
    if text not in AVAILABILITY:
        raise ReportError(f"availability must be one of {AVAILABILITY}, got {text[:32]!r}")
    return text


def parse_event(payload: bytes) -> DeviceEvent:
    """A progress or outcome event (``UpdateReporter.progress`` / ``outcome``)."""
    event = _json_object(payload)
    step = _text(event.get("step"), 32)
    if not step:
        raise ReportError("an event needs a 'step'")
    done = step == "done"
    keep = ("model", "version", "bytes", "total", "message")
    return DeviceEvent(
        deployment_id=_text(event.get("deployment_id"), 128),
        step=step,
        result=_text(event.get("result"), 32),
        code=_text(event.get("code"), 64),
        message=_text(event.get("message"), 1000),
        outcome=classify(event) if done else "",
        detail={k: _text(event[k], 256) or _number(event[k]) for k in keep if k in event},
    )
