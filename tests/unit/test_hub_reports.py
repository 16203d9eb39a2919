"""Parsing device messages for the hub server: what is kept, and every hostile shape refused
with a reason (never another exception)."""

from __future__ import annotations

import json
import re

import pytest

from edgeagent.hub.server.reports import (
    ReportError,
    parse_availability,
    parse_event,
    parse_state,
    parse_topic,
)
from edgeagent.hub.server.settings import normalise_database_url


def test_a_real_state_report_gives_the_devices_columns() -> None:
    report = {
        "group": "lab",
        "agent_version": "0.1.0",
        "updated_at": 1700000000.5,
        "profile": {"profile": "jetson-orin", "board": {"model": "NVIDIA Jetson AGX Orin"}},
        "models": {
            "mobilenet_v2": {
                "active_version": "1.2.0",
                "versions": {
                    "1.2.0": {
                        "runtime": "onnxruntime",
                        "device": "TensorRT",
                        "precision": "int8",
                        "queued": 0,
                    }
                },
            }
        },
        "governor": {
            "state": "warm",
            "temperatures": [
                {"sensor": "gpu", "celsius": 71.0},
                {"sensor": "cpu", "celsius": None},
            ],
            "power": {"total_w": 12.5},
        },
        "updates": {
            "current": {"state": "downloading"},
            "last": {"result": "succeeded", "code": "installed"},
        },
    }
    values = parse_state(json.dumps(report).encode()).values
    assert values["models"] == {"mobilenet_v2": "1.2.0"}
    assert values["backends"]["mobilenet_v2"] == {
        "runtime": "onnxruntime",
        "device": "TensorRT",
        "precision": "int8",
    }
    assert (values["board"], values["profile"]) == ("NVIDIA Jetson AGX Orin", "jetson-orin")
    assert values["temperatures"] == {"gpu": 71.0} and values["max_temp_c"] == 71.0
    assert (values["governor_state"], values["power_w"]) == ("warm", 12.5)
    assert (values["update_state"], values["last_result"]) == ("downloading", "succeeded")


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ({"models": "x", "governor": [], "profile": 3, "updates": None}, "updates"),
        ({"models": {"m": {"active_version": 7}}}, "models.m.active_version"),
        ({"governor": {"temperatures": [{"celsius": "hot"}]}}, "governor.temperatures[0].sensor"),
        ({"group": {"nested": True}, "updated_at": "yesterday"}, "group"),
        ({"updated_at": "yesterday"}, "updated_at"),
        ({"agent_version": ["1"]}, "agent_version"),
        ({"governor": {"power": {"total_w": True}}}, "governor.power.total_w"),
        ({"updates": {"last": {"result": "won"}}}, "updates.last.result"),
        ({"schema": 99}, "schema"),
    ],
)
def test_wrong_field_types_are_refused_naming_the_field(payload: dict, field: str) -> None:
    """Issue 22: one parser for the hub; a wrong type is refused, not silently blanked."""
    with pytest.raises(ReportError, match=rf"^state report: {re.escape(field)}: "):
        parse_state(json.dumps(payload).encode())


def test_a_section_the_device_could_not_read_is_kept_as_its_error() -> None:
    report = parse_state(b'{"models": {"error": "registry down"}, "group": "lab"}')
    assert report.values["models"] == {} and report.values["group_name"] == "lab"


@pytest.mark.parametrize(
    "payload", [b"{", b"[]", b'"text"', b"\xff\xfe", b"null", b'{"a": NaN}', b'{"a": 1, "a": 2}']
)
def test_non_objects_are_refused(payload: bytes) -> None:
    with pytest.raises(ReportError):
        parse_state(payload)


@pytest.mark.parametrize(
    "topic",
    [
        "other/device/a/state",
        "edgeagent/device/a/b/state",
        "edgeagent/device/a/secrets",
        "edgeagent/device/../state",
        "edgeagent/device/" + "x" * 200 + "/state",
        "edgeagent/device/-dash/state",
    ],
)
def test_topics_that_are_not_a_device_report(topic: str) -> None:
    with pytest.raises(ReportError):
        parse_topic(topic, "edgeagent")


def test_topic_gives_the_device_and_kind() -> None:
    where = parse_topic("fleet/eu/device/cam-7/events", "fleet/eu")
    assert (where.device_id, where.kind) == ("cam-7", "events")


def test_events_and_outcomes() -> None:
    done = {"step": "done", "result": "refused", "code": "same_version", "deployment_id": "d1"}
    assert parse_event(json.dumps(done).encode()).outcome == "succeeded"  # already there
    failed = {**done, "result": "failed", "code": "health_check"}
    assert parse_event(json.dumps(failed).encode()).outcome == "failed"
    progress = parse_event(b'{"step": "downloading", "bytes": 10, "deployment_id": "d1"}')
    assert progress.outcome == "" and progress.detail == {"bytes": 10.0}
    with pytest.raises(ReportError):
        parse_event(b'{"result": "succeeded"}')
    assert parse_availability(b"offline") == "offline"
    with pytest.raises(ReportError):
        parse_availability(b"gone fishing")


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("sqlite:///x.db", "sqlite+aiosqlite:///x.db"),
        ("postgresql://u@h/db", "postgresql+asyncpg://u@h/db"),
        ("postgresql+asyncpg://u@h/db", "postgresql+asyncpg://u@h/db"),
    ],
)
def test_database_urls(given: str, expected: str) -> None:
    assert normalise_database_url(given) == expected


def test_other_databases_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="expected sqlite"):
        normalise_database_url("mysql://u@h/db")
