"""``edgeagent hub status``: the fleet table, read from the devices' retained reports alone.

Every device keeps a retained ``…/state`` report and a retained ``…/availability`` (its Last
Will turns it to ``offline``), so subscribing for a moment gives the whole fleet's last known
state without a database on the hub.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

import aiomqtt

from edgeagent.fleet.settings import MqttSettings
from edgeagent.fleet.topics import DeviceTopics
from edgeagent.hub.keys import HubError
from edgeagent.hub.publish import hub_client


def fleet_row(device_id: str, state: dict[str, Any], availability: str) -> dict[str, Any]:
    """One device's line: availability, models and versions, the last update outcome."""
    updates = state.get("updates") or {}
    last = updates.get("last") or {}
    current = updates.get("current") or {}
    models = state.get("models") or {}
    return {
        "device_id": device_id,
        "group": state.get("group", ""),
        "online": availability == "online",
        "availability": availability or "unknown",
        "models": {
            name: (info.get("active_version") if isinstance(info, dict) else None)
            for name, info in sorted(models.items())
        },
        "update_state": current.get("state", "idle"),
        "last_result": last.get("result", ""),
        "last_code": last.get("code", ""),
        "last_release": f"{last.get('model', '')} {last.get('version', '')}".strip(),
        "deployment_id": last.get("deployment_id", ""),
        "reported_at": state.get("updated_at"),
    }


async def collect_fleet(
    settings: MqttSettings, *, group: str | None = None, wait_s: float = 1.0
) -> list[dict[str, Any]]:
    """Read every retained device report for ``wait_s`` seconds; one row per device."""
    prefix = settings.topic_prefix
    states: dict[str, dict[str, Any]] = {}
    availability: dict[str, str] = {}
    try:
        async with hub_client(settings, "status") as client:
            every_device = DeviceTopics(prefix)
            await client.subscribe(every_device.state.name, qos=1)
            await client.subscribe(every_device.availability.name, qos=1)
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
                    with contextlib.suppress(ValueError):
                        states[device] = json.loads(payload)
    except aiomqtt.MqttError as exc:
        raise HubError(f"broker {settings.host}:{settings.port}: {exc}") from exc
    rows = [
        fleet_row(device, states.get(device, {}), availability.get(device, ""))
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
