"""``edgeagent hub status``: the fleet table, read from the devices' retained reports alone.

Every device keeps a retained ``…/state`` report and a retained ``…/availability`` (its Last
Will turns it to ``offline``), so subscribing for a moment gives the whole fleet's last known
state without a database on the hub.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import aiomqtt

from edgeagent.fleet.messages import (
    Event,
    MessageError,
    Outcome,
    StateReport,
    decode_event,
    decode_state,
)
from edgeagent.fleet.settings import MqttSettings
from edgeagent.fleet.topics import DeviceTopics
from edgeagent.hub.keys import HubError
from edgeagent.hub.publish import MAX_REPORT_BYTES, hub_client

log = logging.getLogger(__name__)


def _bounded(payload: Any, what: str) -> bytes | None:
    """The payload's bytes when it is a report's size (bounded before any parse), else None."""
    if not isinstance(payload, (bytes, bytearray)) or len(payload) > MAX_REPORT_BYTES:
        log.warning("skipped the %s: not a report of at most %d bytes", what, MAX_REPORT_BYTES)
        return None
    return bytes(payload)


def read_event(payload: Any, what: str) -> Event | None:
    """A device's install event, or None — with a warning naming the wrong field — when the
    payload is not one (the parser the hub server uses too: ``fleet.messages``)."""
    data = _bounded(payload, what)
    if data is None:
        return None
    try:
        return decode_event(data, what)
    except MessageError as exc:
        log.warning("skipped it: %s", exc)
        return None


def read_state(payload: Any, what: str) -> StateReport | None:
    """A device's state report, or None — with a warning naming the wrong field — when the
    payload is not one (the parser the hub server uses too: ``fleet.messages``)."""
    data = _bounded(payload, what)
    if data is None:
        return None
    try:
        return decode_state(data, what)
    except MessageError as exc:
        log.warning("skipped it: %s", exc)
        return None


def _text(value: str) -> str:
    return value[:128]


def fleet_row(
    device_id: str, state: StateReport | dict[str, Any], availability: str
) -> dict[str, Any]:
    """One device's line: availability, models and versions, the last update outcome
    (``state`` decoded JSON is read by the contract's parser first: MessageError if bad)."""
    if isinstance(state, dict):
        state = decode_state(state, f"state report of {device_id}")
    last = state.updates.last or Outcome("refused")
    known = state.updates.last is not None
    return {
        "device_id": device_id,
        "group": _text(state.group),
        "online": availability == "online",
        "availability": availability or "unknown",
        "models": {
            name: _text(info.active_version or "") or None
            for name, info in sorted(state.models.items())
        },
        "update_state": _text(state.updates.current.state) or "idle",
        "last_result": _text(last.result) if known else "",
        "last_code": _text(last.code),
        "last_release": f"{_text(last.model)} {_text(last.version)}".strip(),
        "deployment_id": _text(last.deployment_id),
        "public_key": _text(state.device_key.public_key if state.device_key else ""),
        "reported_at": state.updated_at,
    }


async def collect_fleet(
    settings: MqttSettings, *, group: str | None = None, wait_s: float = 1.0
) -> list[dict[str, Any]]:
    """Read every retained device report for ``wait_s`` seconds; one row per device."""
    prefix = settings.topic_prefix
    states: dict[str, StateReport] = {}
    availability: dict[str, str] = {}
    try:
        async with hub_client(settings, "status") as client:
            every_device = DeviceTopics(prefix)
            # QoS 0: Mosquitto queues at most max_queued_messages (1000) QoS 1 messages per
            # subscriber and silently drops the rest of a large fleet's retained reports.
            await client.subscribe(every_device.state.name, qos=0)
            await client.subscribe(every_device.availability.name, qos=0)
            messages = aiter(client.messages)
            deadline = time.monotonic() + wait_s
            while (left := deadline - time.monotonic()) > 0:
                try:
                    message = await asyncio.wait_for(anext(messages), left)
                except asyncio.TimeoutError:
                    break
                where = DeviceTopics.parse(prefix, message.topic.value)
                payload = message.payload
                if where is None or not isinstance(payload, (bytes, bytearray)) or not payload:
                    continue
                device, kind = where
                if kind == "availability":
                    availability[device] = bytes(payload).decode(errors="replace")
                elif kind == "state":
                    state = read_state(payload, f"state report of {device}")
                    if state is not None:
                        states[device] = state
    except aiomqtt.MqttError as exc:
        raise HubError(f"broker {settings.host}:{settings.port}: {exc}") from exc
    rows = [
        fleet_row(device, states.get(device, StateReport()), availability.get(device, ""))
        for device in sorted(set(states) | set(availability))
    ]
    return [r for r in rows if group is None or r["group"] == group]


def format_table(rows: list[dict[str, Any]]) -> str:
    """A fixed-width table for people; ``--json`` gives the rows to scripts."""
    header = ("DEVICE", "GROUP", "ONLINE", "MODELS", "UPDATE", "LAST RESULT", "DEPLOYMENT")
    lines = [header]
    for row in rows:
        models = ", ".join(f"{n} {v}" for n, v in row["models"].items()) or "-"
        result = f"{row['last_result']} ({row['last_code']})" if row["last_result"] else "-"
        if row["last_release"]:
            result = f"{row['last_release']}: {result}"
        lines.append(
            (
                row["device_id"],
                row["group"] or "-",
                "yes" if row["online"] else row["availability"],
                models,
                row["update_state"],
                result,
                row["deployment_id"] or "-",
            )
        )
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(header))]
    text = [
        "  ".join(str(c).ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
        for line in lines
    ]
    summary = f"{len(rows)} device(s), {sum(r['online'] for r in rows)} online"
    return "\n".join([*text, summary])
