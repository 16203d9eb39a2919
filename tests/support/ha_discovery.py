"""Home Assistant's MQTT discovery schema for binary_sensor and sensor, reproduced as a check.

Home Assistant validates a discovery payload with voluptuous schemas in
homeassistant/components/mqtt/: ``schemas.py`` (MQTT_AVAILABILITY_SCHEMA,
MQTT_ENTITY_DEVICE_INFO_SCHEMA, MQTT_ENTITY_COMMON_SCHEMA), the read-only base
(``state_topic`` required, ``qos``, ``value_template``) and each platform's own keys in
``binary_sensor.py`` and ``sensor.py``; the device classes are those of
``homeassistant.components.binary_sensor.BinarySensorDeviceClass`` and
``homeassistant.components.sensor`` (state classes ``SensorStateClass``). voluptuous and
Home Assistant are not dependencies of this project, so the same rules are written out here:
every key HA accepts with its type and range, ``availability_topic``/``availability``
exclusive, a device with at least one identifier, and ``valid_subscribe_topic``'s rules. One
deliberate difference: HA drops unknown keys silently; this check refuses them, so a typo in a
key name fails the test instead of being ignored by Home Assistant.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

BINARY_SENSOR_DEVICE_CLASSES = {
    "battery", "battery_charging", "carbon_monoxide", "cold", "connectivity", "door",
    "garage_door", "gas", "heat", "light", "lock", "moisture", "motion", "moving", "occupancy",
    "opening", "plug", "power", "presence", "problem", "running", "safety", "smoke", "sound",
    "tamper", "update", "vibration", "window",
}  # fmt: skip
STATE_CLASSES = {"measurement", "measurement_angle", "total", "total_increasing"}
ENTITY_CATEGORIES = {"config", "diagnostic"}


class Invalid(ValueError):
    """The payload Home Assistant would refuse, and why."""


def string(value: Any) -> str:
    # cv.string accepts numbers too (it str()s them), but never a list, dict or None.
    if value is None or isinstance(value, (list, dict)):
        raise Invalid(f"expected a string, got {value!r}")
    return str(value)


def boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise Invalid(f"expected a boolean, got {value!r}")


def positive_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise Invalid(f"expected a non-negative integer, got {value!r}")
    return value


def qos(value: Any) -> int:
    if value not in (0, 1, 2) or isinstance(value, bool):
        raise Invalid(f"qos must be 0, 1 or 2, got {value!r}")
    return value


def subscribe_topic(value: Any) -> str:
    """homeassistant/components/mqtt/util.py valid_subscribe_topic."""
    topic = string(value)
    encoded = topic.encode("utf-8")
    if not topic or len(encoded) > 65535 or "\0" in topic:
        raise Invalid(f"invalid MQTT topic {topic!r}")
    levels = topic.split("/")
    for i, level in enumerate(levels):
        if "#" in level and (level != "#" or i != len(levels) - 1):
            raise Invalid(f"multi-level wildcard misplaced in {topic!r}")
        if "+" in level and level != "+":
            raise Invalid(f"single-level wildcard misplaced in {topic!r}")
    return topic


def one_of(options: set[str]) -> Callable[[Any], str]:
    def check(value: Any) -> str:
        if value not in options:
            raise Invalid(f"{value!r} is not one of {sorted(options)}")
        return value

    return check


def device(value: Any) -> dict:
    keys: dict[str, Callable[[Any], Any]] = {
        "identifiers": lambda v: [string(x) for x in (v if isinstance(v, list) else [v])],
        "connections": lambda v: [[string(x) for x in pair] for pair in v],
        "manufacturer": string, "model": string, "model_id": string, "name": string,
        "hw_version": string, "serial_number": string, "sw_version": string,
        "via_device": string, "suggested_area": string, "configuration_url": string,
    }  # fmt: skip
    checked = _check(value, keys, required=set(), where="device")
    if not checked.get("identifiers") and not checked.get("connections"):
        raise Invalid("Device must have at least one identifying value")
    return checked


COMMON: dict[str, Callable[[Any], Any]] = {
    # MQTT_AVAILABILITY_SCHEMA (single form) and MQTT_ENTITY_COMMON_SCHEMA
    "availability_topic": subscribe_topic,
    "availability_template": string,
    "payload_available": string,
    "payload_not_available": string,
    "availability_mode": one_of({"all", "any", "latest"}),
    "availability": lambda v: v if isinstance(v, list) else [v],
    "device": device,
    "origin": lambda v: _check(v, {"name": string, "sw_version": string, "support_url": string},
                               {"name"}, "origin"),
    "enabled_by_default": boolean,
    "entity_category": one_of(ENTITY_CATEGORIES),
    "icon": string,
    "json_attributes_topic": subscribe_topic,
    "json_attributes_template": string,
    "object_id": string,  # deprecated by newer releases for default_entity_id; both accepted
    "default_entity_id": string,
    "unique_id": string,
    # the read-only platform base
    "state_topic": subscribe_topic,
    "qos": qos,
    "value_template": string,
    "name": lambda v: v if v is None else string(v),
    "encoding": string,
    "entity_picture": string,
}  # fmt: skip

BINARY_SENSOR = {
    **COMMON,
    "device_class": one_of(BINARY_SENSOR_DEVICE_CLASSES),
    "expire_after": positive_int,
    "force_update": boolean,
    "off_delay": positive_int,
    "payload_off": string,
    "payload_on": string,
}
SENSOR = {
    **COMMON,
    "device_class": string,  # checked against the unit in HA; none is sent here
    "expire_after": positive_int,
    "force_update": boolean,
    "last_reset_value_template": string,
    "options": lambda v: [string(x) for x in v],
    "state_class": one_of(STATE_CLASSES),
    "suggested_display_precision": positive_int,
    "unit_of_measurement": string,
}


def _check(value: Any, keys: dict, required: set[str], where: str) -> dict:
    if not isinstance(value, dict):
        raise Invalid(f"{where}: expected a mapping, got {value!r}")
    unknown = set(value) - set(keys)
    if unknown:
        raise Invalid(f"{where}: keys HA does not know: {sorted(unknown)}")
    missing = required - set(value)
    if missing:
        raise Invalid(f"{where}: required key(s) missing: {sorted(missing)}")
    return {key: keys[key](item) for key, item in value.items()}


def validate(component: str, payload: Any) -> dict:
    """The payload as HA would accept it for ``component``; Invalid when HA would refuse it."""
    keys = {"binary_sensor": BINARY_SENSOR, "sensor": SENSOR}[component]
    checked = _check(payload, keys, {"state_topic"}, component)
    if "availability_topic" in checked and "availability" in checked:
        raise Invalid("availability_topic and availability are exclusive")
    return checked
