"""The device ↔ hub contract (issue 22): every message recorded from the release before it
still parses with the new parser (a fleet of old agents keeps working with a new hub), the new
writer's messages round-trip, the JSON Schemas agree with the types, and wrong types are
refused naming the field.

The recordings (tests/fixtures/fleet/*.json) came from ``tests/fixtures/fleet/record.py`` run on
commit d13198f: a real agent process, a real broker, a good, a broken and a junk release.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from edgeagent.fleet.messages import (
    Event,
    MessageError,
    Outcome,
    decode_availability,
    decode_event,
    decode_state,
    encode,
    schemas,
)
from edgeagent.hub.server.reports import parse_event, parse_state
from edgeagent.updates.report import UpdateReporter

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "fleet"


def recorded(kind: str) -> list[str]:
    payloads = [
        payload
        for path in sorted(FIXTURES.glob(f"{kind}-*.json"))
        for payload in json.loads(path.read_text(encoding="utf-8"))["payloads"]
    ]
    assert payloads, f"no recorded {kind} messages in {FIXTURES}"
    return payloads


def test_every_recorded_state_report_parses_and_keeps_its_facts() -> None:
    for payload in recorded("state"):
        raw = json.loads(payload)
        report = decode_state(payload.encode())
        assert (report.device_id, report.group) == (raw["device_id"], raw["group"])
        assert {n: m.active_version for n, m in report.models.items()} == {
            n: m["active_version"] for n, m in raw["models"].items()
        }
        assert report.updates.current.state == raw["updates"]["current"]["state"]
        assert (report.updates.last is None) == (raw["updates"]["last"] is None)
        assert len(report.updates.history) == len(raw["updates"]["history"])
        assert parse_state(payload.encode()).values["group_name"] == raw["group"]  # the server


def test_every_recorded_event_parses_and_outcomes_are_seen() -> None:
    results = []
    for payload in recorded("events"):
        raw = json.loads(payload)
        event = decode_event(payload.encode())
        assert (event.step, event.deployment_id) == (raw["step"], raw["deployment_id"])
        if event.outcome is not None:
            results.append(event.outcome.result)
        assert parse_event(payload.encode()).step == raw["step"]
    assert results == ["succeeded", "failed", "refused"]


def test_recorded_availability() -> None:
    assert [decode_availability(p.encode()) for p in recorded("availability")] == [
        "online",
        "offline",
    ]


@pytest.mark.parametrize("kind", ["state", "events"])
def test_recorded_messages_meet_the_published_schema(kind: str) -> None:
    schema = schemas()["state-report.json" if kind == "state" else "event.json"]
    for payload in recorded(kind):
        jsonschema.validate(json.loads(payload), schema)


def reporter_messages(tmp_path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """What the new writer sends for one install, a refusal and a broken source."""
    states: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []

    def broken() -> dict[str, Any]:
        raise RuntimeError("registry down")

    reporter = UpdateReporter(
        "dev-1",
        "lab",
        sources={
            "models": broken,
            "governor": lambda: {"state": "warm", "temperatures": [{"sensor": "cpu"}]},
            "listeners": lambda: {"internal": "never on the wire"},
        },
        state_file=tmp_path / "report.json",
    )
    reporter.connect(states.append, events.append)
    release = {"model": "tiny", "version": "2", "deployment_id": "d1"}
    reporter.progress(release, "downloading", bytes=10, total=20)
    reporter.progress(release, "canary_promoted", share=0.1, variants=["onnxruntime/fp32"])
    reporter.outcome(release, "succeeded", "committed", "ok", details={"canary": {"n": 3}})
    reporter.outcome({}, "refused", "malformed", "junk", persist=False)
    return states, events


def test_the_new_writer_round_trips_and_meets_the_schema(tmp_path: Path) -> None:
    states, events = reporter_messages(tmp_path)
    for state in states:
        assert encode(decode_state(json.dumps(state).encode())) == state
        jsonschema.validate(state, schemas()["state-report.json"])
        assert "listeners" not in state and state["schema"] == 1
        assert state["errors"] == {"models": "registry down"}
    for event in events:
        assert encode(decode_event(json.dumps(event).encode())) == event
        jsonschema.validate(event, schemas()["event.json"])
    assert events[0]["bytes"] == 10 and events[1]["share"] == 0.1
    done = decode_event(json.dumps(events[2]).encode()).outcome
    assert done == Outcome("succeeded", "committed", "ok", "tiny", "2", "d1", done.at, {"n": 3})
    jsonschema.validate(encode(done), schemas()["outcome.json"])
    saved = UpdateReporter("dev-1", "lab", state_file=tmp_path / "report.json")
    assert saved.last == encode(done)  # the outcome survives a restart through its type


def mutations(value: Any, path: str = "") -> list[tuple[str, Any]]:
    """(path, replacement) for every leaf and container: a value of the wrong JSON type."""
    wrong: Any
    if isinstance(value, dict):
        found = [(path, ["not", "an", "object"])] if path else []
        for key, inner in value.items():
            found += mutations(inner, f"{path}.{key}" if path else key)
        return found
    if isinstance(value, list):
        found = [(path, {"not": "a list"})]
        for i, inner in enumerate(value):
            found += mutations(inner, f"{path}[{i}]")
        return found
    if isinstance(value, str):
        wrong = 3
    elif isinstance(value, bool):
        wrong = "yes"
    elif isinstance(value, (int, float)):
        wrong = "1.5"
    else:
        return []
    return [(path, wrong)]


def replaced(document: Any, path: str, new: Any) -> Any:
    steps = path.replace("[", ".[").split(".")
    copy = json.loads(json.dumps(document))
    target = copy
    for step in steps[:-1]:
        target = target[int(step[1:-1])] if step.startswith("[") else target[step]
    last = steps[-1]
    if last.startswith("["):
        target[int(last[1:-1])] = new
    else:
        target[last] = new
    return copy


def test_schema_and_parser_refuse_the_same_wrong_types(tmp_path: Path) -> None:
    """Each declared field of a real report given a wrong type: the schema says invalid and
    the parser refuses naming that field (free-form step details excepted: any type goes)."""
    states, events = reporter_messages(tmp_path)
    cases = [(states[-1], decode_state, "state-report.json")]
    cases += [(e, decode_event, "event.json") for e in events]
    checked = 0
    for document, decode, name in cases:
        validator = jsonschema.Draft202012Validator(schemas()[name])
        for path, wrong in mutations(document):
            free = path.split(".")[0].split("[")[0] in ("share", "variants") or "canary." in path
            if free:
                continue  # details and canary figures are free-form scalars
            bad = replaced(document, path, wrong)
            assert not validator.is_valid(bad), path
            with pytest.raises(MessageError) as refused:
                decode(json.dumps(bad).encode())
            assert refused.value.path == path
            checked += 1
    assert checked > 30


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b'{"models": {"m": {"versions": {"1": {"runtime": 3}}}}}', "models.m.versions['1']"),
        (b'{"updates": {"history": [{"result": "ok"}]}}', "updates.history[0].result"),
        (b'{"updates": {"current": []}}', "updates.current: must be an object, got a list"),
        (b'{"online": "yes"}', "online: must be true or false"),
        (b'{"schema": 2}', "schema: 2 is newer"),
        (b'{"updated_at": 1e999}', "updated_at: must be a finite number, got inf"),
        (b"[" * 200 + b"]" * 200, "nested deeper"),
        (b"\xff", "not UTF-8"),
    ],
)
def test_hostile_state_reports_are_refused_with_the_field(payload: bytes, message: str) -> None:
    with pytest.raises(MessageError, match="^state report: ") as refused:
        decode_state(payload)
    assert message in str(refused.value)


def test_unknown_fields_are_tolerated_and_a_done_event_needs_its_result() -> None:
    report = decode_state(b'{"group": "lab", "future": {"x": [1]}, "models": {}}')
    assert report.group == "lab"
    event = decode_event(b'{"step": "verified", "new_thing": {"deep": {"x": 1}}, "n": 1}')
    assert event.detail == {"n": 1}
    with pytest.raises(MessageError, match="event: result: missing"):
        decode_event(b'{"step": "done"}')
    with pytest.raises(MessageError, match="event: step: missing"):
        decode_event(b'{"result": "succeeded"}')
    with pytest.raises(MessageError, match="availability"):
        decode_availability(b"gone fishing")
    assert Event.done("d", Outcome("failed")).outcome == Outcome("failed")


def test_the_docs_publish_the_schemas_the_types_give() -> None:
    page = (FIXTURES.parents[2] / "docs" / "fleet" / "messages.md").read_text(encoding="utf-8")
    published = {
        name: json.loads(block.split("```json\n", 1)[1].split("\n```", 1)[0])
        for name, block in (part.split("\n", 1) for part in page.split("\n### ")[1:])
    }
    assert published == schemas(), "regenerate the schemas on docs/fleet/messages.md"
