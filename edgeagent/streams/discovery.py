"""Home Assistant MQTT discovery: the retained config payloads that make each camera appear in
Home Assistant with no YAML — a binary sensor "<label> present" per stream and a sensor
counting each label in view — bound to the agent's availability topic (its Last Will says
"offline", so the entities go unavailable when the agent does).

Keys are Home Assistant's full names (not the abbreviations), as its MQTT binary_sensor and
sensor platforms validate them (homeassistant/components/mqtt/binary_sensor.py, sensor.py,
schemas.py).
"""

from __future__ import annotations

import re
from typing import Any

from edgeagent import __version__
from edgeagent.fleet.topics import DeviceTopics, Topic, discovery_topic

PRESENCE_LABEL = "person"  # the binary sensor every stream gets


def object_id(*parts: str) -> str:
    """A Home Assistant node/object id: [a-zA-Z0-9_-] only."""
    return re.sub(r"[^a-zA-Z0-9_-]", "_", "_".join(parts))


def _device(device_id: str) -> dict[str, Any]:
    return {
        "identifiers": [object_id("edgeagent", device_id)],
        "name": f"edgeagent {device_id}",
        "manufacturer": "edgeagent",
        "model": "edgeagent",
        "sw_version": __version__,
    }


def _common(topics: DeviceTopics, unique: str, name: str, state: Topic) -> dict[str, Any]:
    return {
        "name": name,
        "unique_id": unique,  # no object_id: newer Home Assistant replaced it (default_entity_id)
        "state_topic": state.name,
        "availability_topic": topics.availability.name,
        "payload_available": "online",
        "payload_not_available": "offline",
        "qos": 1,
        "device": _device(topics.device_id),
    }


def presence_config(
    prefix: str, topics: DeviceTopics, stream: str, label: str = PRESENCE_LABEL
) -> tuple[Topic, dict[str, Any]]:
    """A binary sensor that is ON while a ``label`` track is live on ``stream``."""
    unique = object_id("edgeagent", topics.device_id, stream, label, "present")
    payload = _common(
        topics, unique, f"{stream} {label} present", topics.stream(stream, "presence", label)
    )
    payload |= {
        "device_class": "occupancy",
        "payload_on": "ON",
        "payload_off": "OFF",
    }
    return discovery_topic(prefix, "binary_sensor", object_id(topics.device_id), unique), payload


def count_config(
    prefix: str, topics: DeviceTopics, stream: str, label: str
) -> tuple[Topic, dict[str, Any]]:
    """A sensor counting the live ``label`` tracks on ``stream``."""
    unique = object_id("edgeagent", topics.device_id, stream, label, "count")
    payload = _common(
        topics, unique, f"{stream} {label} count", topics.stream(stream, "count", label)
    )
    payload |= {"state_class": "measurement", "unit_of_measurement": "objects"}
    return discovery_topic(prefix, "sensor", object_id(topics.device_id), unique), payload
