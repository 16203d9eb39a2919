"""Issue 23, finding 10: the hub server's REST inputs are checked strictly, and each refusal is a
JSON 4xx that names the input — where a NUL in a filter, deep JSON, ``10**400`` or a release id
past the column's range were 500s, ``"release_id": true`` was read as 1, ``/releases/٣`` as
release 3, and ``min_executed: 2.7`` was truncated. Nothing is written by a refused request.

Every case runs against a real server on SQLite and on PostgreSQL (the databases fail
differently: PostgreSQL refuses a NUL in a string and an integer past int4 itself)."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from openapi_spec_validator import validate

from devtools.broker import Broker
from devtools.hub_fleet import Api, fleet, hub_server, make_release
from edgeagent.hub.server import api_inputs, inputs
from edgeagent.hub.server.api import openapi_document
from edgeagent.hub.server.settings import ServerSettings
from tests.support.postgres import database_url_fixture, postgres_fixture  # noqa: F401

pytestmark = [pytest.mark.broker, pytest.mark.timeout(120)]

JSON = {"Content-Type": "application/json"}


async def _answer(url: str, method: str, path: str, **kwargs: Any) -> tuple[int, Any, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, f"{url}{path}", **kwargs) as response,
    ):
        text = await response.text()
        try:
            body = json.loads(text)
        except ValueError:
            body = text
        return response.status, body, response.headers


def _raw(release_id: int, text: str) -> dict[str, Any]:
    """A deployment body with one field written as raw JSON text (``10**400`` has no float)."""
    return {"data": f'{{"release_id": {release_id}, "group": "lab", {text}}}', "headers": JSON}


async def test_every_input_is_checked_and_named(broker: Broker, database_url: str) -> None:
    settings = broker.settings()
    async with fleet(settings, 2), hub_server(database_url, settings) as url:
        api = Api(url)
        await api.synced()
        release = await api.call("POST", "/api/v1/releases", expect=201, data=make_release("2.0.0"))
        rid = release["id"]
        deep = "[" * 5000 + "]" * 5000
        cases: list[tuple[str, str, dict[str, Any], int, str]] = [
            # a NUL (or another control character) in a string filter or id
            ("GET", "/api/v1/devices?group=a%00b", {}, 400, "group"),
            ("GET", "/api/v1/devices?model=m%00&version=1", {}, 400, "model"),
            ("GET", "/api/v1/devices?profile=%01", {}, 400, "profile"),
            ("GET", "/api/v1/devices?governor_state=%00", {}, 400, "governor_state"),
            ("GET", "/api/v1/devices/dev%00", {}, 400, "device_id"),
            ("GET", "/api/v1/devices/dev%00/history", {}, 400, "device_id"),
            ("GET", "/api/v1/releases?model=%00", {}, 400, "model"),
            ("GET", "/api/v1/deployments/x%00", {}, 400, "deployment_id"),
            ("POST", "/api/v1/deployments/x%00/pause", {}, 400, "deployment_id"),
            (
                "POST",
                "/api/v1/deployments",
                {"json": {"model": "m\0", "version": "1"}},
                422,
                "model",
            ),
            (
                "POST",
                "/api/v1/deployments",
                {"json": {"release_id": rid, "group": "l\0"}},
                422,
                "group",
            ),
            (
                "POST",
                "/api/v1/deployments",
                {"json": {"release_id": rid, "group": "lab", "devices": ["dev-000\0"]}},
                422,
                "devices[0]",
            ),
            ("POST", "/api/v1/deployments/x/abort", {"json": {"reason": "r\0"}}, 422, "reason"),
            (
                "POST",
                "/api/v1/deployments/x/rollback",
                {"json": {"version": "1\0"}},
                422,
                "version",
            ),
            # ids: ASCII digits only, within the column's range
            ("GET", "/api/v1/releases/%D9%A3", {}, 400, "release_id"),  # Arabic-Indic 3
            ("GET", "/api/v1/releases/+1", {}, 400, "release_id"),
            ("GET", f"/api/v1/releases/{2**63}", {}, 400, "release_id"),
            ("GET", f"/api/v1/releases/{2**31}/envelope", {}, 400, "release_id"),
            ("GET", "/api/v1/releases/0", {}, 400, "release_id"),
            (
                "POST",
                "/api/v1/deployments",
                {"json": {"release_id": True, "group": "lab"}},
                422,
                "release_id",
            ),
            (
                "POST",
                "/api/v1/deployments",
                {"json": {"release_id": 2**63, "group": "lab"}},
                422,
                "release_id",
            ),
            (
                "POST",
                "/api/v1/deployments",
                {"json": {"release_id": 2**31, "group": "lab"}},
                422,
                "release_id",
            ),
            (
                "POST",
                "/api/v1/deployments",
                {"json": {"release_id": float(rid), "group": "lab"}},
                422,
                "release_id",
            ),
            # numbers: finite, integers not truncated, no booleans
            (
                "POST",
                "/api/v1/deployments",
                _raw(rid, '"stages_pct": [1' + "0" * 400 + "]"),
                422,
                "stages_pct[0]",
            ),
            (
                "POST",
                "/api/v1/deployments",
                _raw(rid, '"abort_threshold_pct": 1e400'),
                422,
                "abort_threshold_pct",
            ),
            (
                "POST",
                "/api/v1/deployments",
                _raw(rid, '"min_executed": 1e400'),
                422,
                "min_executed",
            ),
            (
                "POST",
                "/api/v1/deployments",
                _raw(rid, '"min_executed": 1' + "0" * 30),
                422,
                "min_executed",
            ),
            ("POST", "/api/v1/deployments", _raw(rid, '"min_executed": 2.7'), 422, "min_executed"),
            (
                "POST",
                "/api/v1/deployments",
                _raw(rid, '"stage_timeout_s": true'),
                422,
                "stage_timeout_s",
            ),
            (
                "POST",
                "/api/v1/deployments/x/rollback",
                {"json": {"version": "1.0.0", "stage_timeout_s": True}},
                422,
                "stage_timeout_s",
            ),
            ("GET", "/api/v1/devices?limit=%D9%A3", {}, 400, "limit"),
            ("GET", "/api/v1/devices?offset=1e400", {}, 400, "offset"),
            ("GET", f"/api/v1/devices?wait=1&after={10**400}", {}, 400, "after"),
            ("GET", "/api/v1/health?wait=nan", {}, 400, "wait"),
            ("GET", "/api/v1/health?wait=1e400", {}, 400, "wait"),
            ("GET", "/api/v1/devices/dev-000/history?before=inf", {}, 400, "before"),
            # a field or query parameter nobody declared is a typo, not something to ignore
            ("GET", "/api/v1/devices?grup=lab", {}, 400, "grup"),
            (
                "POST",
                "/api/v1/deployments",
                {"json": {"release_id": rid, "group": "lab", "stage_pct": [100]}},
                422,
                "stage_pct",
            ),
            # deep JSON is refused before it is parsed
            ("POST", "/api/v1/deployments", {"data": deep, "headers": JSON}, 400, "nested"),
            ("POST", "/api/v1/deployments/x/pause", {"data": deep, "headers": JSON}, 400, "nested"),
            (
                "POST",
                "/api/v1/deployments",
                {"data": '{"a": 1, "a": 2}', "headers": JSON},
                400,
                "twice",
            ),
        ]
        wrong = []
        for method, path, kwargs, status, named in cases:
            got, body, _ = await _answer(url, method, path, **kwargs)
            error = body.get("error", "") if isinstance(body, dict) else ""
            if got != status or named not in error:
                wrong.append((method, path[:60], status, got, str(body)[:160]))
        assert wrong == []

        # 405 says which methods the route has
        got, body, headers = await _answer(url, "DELETE", "/api/v1/deployments")
        assert got == 405 and body["error"]
        assert set(headers["Allow"].split(",")) >= {"GET", "POST"}, headers.get("Allow")

        # nothing was written, and well-formed input still works
        assert (await api.call("GET", "/api/v1/deployments"))["deployments"] == []
        assert (await api.call("GET", "/api/v1/devices?limit=1&offset=1"))["devices"]
        created = await api.call(
            "POST",
            "/api/v1/deployments",
            expect=201,
            json={"release_id": rid, "group": "lab", "min_executed": 2, "stages_pct": [100]},
        )
        assert (created["min_executed"], created["stages_pct"]) == (2, [100])

        served = await api.call("GET", "/openapi.json")
        assert served == openapi_document(ServerSettings())  # the server's own limits


def _parameter(document: dict[str, Any], path: str, name: str) -> dict[str, Any]:
    (found,) = [p for p in document["paths"][path]["get"]["parameters"] if p["name"] == name]
    return found["schema"]


def test_the_document_is_built_from_the_schemas_the_server_checks_with() -> None:
    document = openapi_document(ServerSettings(page_size=5, max_page_size=7, max_wait_s=9.0))
    validate(document)
    assert _parameter(document, "/api/v1/devices", "limit")["maximum"] == 7
    body = document["paths"]["/api/v1/deployments"]["post"]["requestBody"]
    fields = body["content"]["application/json"]["schema"]
    assert fields["properties"]["stage_timeout_s"]["maximum"] == 9.0
    assert fields == api_inputs.new_deployment(ServerSettings(max_wait_s=9.0))
    assert fields["additionalProperties"] is False
    # the deployment's size limits are the server's --max-stages and --max-device-ids
    small = api_inputs.new_deployment(ServerSettings(max_stages=3, max_device_ids=2))["properties"]
    assert (small["stages_pct"]["maxItems"], small["devices"]["maxItems"]) == (3, 2)
    for bad, flag in ((0, "--max-stages must be 1..100"), (101, "--max-stages must be 1..100")):
        with pytest.raises(ValueError, match=flag):
            ServerSettings(max_stages=bad).validate()
    with pytest.raises(ValueError, match="--max-device-ids must be positive"):
        ServerSettings(max_device_ids=0).validate()

    # a keyword the checker does not enforce cannot be written into the document
    loose = inputs.Param("email", "query", {"type": "string", "format": "email"})
    with pytest.raises(ValueError, match="unenforced"):
        loose.document(ServerSettings())
    # and the hand-written part (summaries, answers) cannot carry inputs of its own
    skeleton = {"paths": {"/x": {"get": {"parameters": [], "responses": {}}}}}
    operation = inputs.Operation("GET", "/x", openapi_document)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="come from inputs.py"):
        inputs.document(skeleton, [operation], ServerSettings())


@pytest.mark.parametrize(
    ("schema", "value", "problem"),
    [
        (inputs.integer(1, 5), True, "must be an integer"),
        (inputs.integer(1, 5), 2.0, "must be an integer"),
        (inputs.integer(1, 5), 6, "must be in [1, 5]"),
        (inputs.number(0, 100, above=True), 0, "must be in (0, 100]"),
        (inputs.number(0, 100), 10**400, "must be a finite number"),
        (inputs.text(3), "abcd", "at most 3 characters"),
        (inputs.text(None, min_length=1), "", "at least 1 characters"),
        (inputs.text(9), "a\ud800", "control characters"),
        (inputs.choice(["a"]), "b", "must be one of a"),
        (inputs.array(inputs.integer(0, 1), 1), [0, 1], "at most 1 items"),
        (inputs.array(inputs.integer(0, 1), 9, min_items=1), [], "at least 1 items"),
        (inputs.obj({"a": inputs.integer(0, 1)}, required=["a"]), {}, "missing"),
        (inputs.obj({}), {"b": 1}, "unknown field"),
    ],
)
def test_every_keyword_is_enforced(schema: dict[str, Any], value: Any, problem: str) -> None:
    with pytest.raises(inputs.InputError, match=problem.replace("[", r"\[").replace("(", r"\(")):
        inputs.check(schema, value, "field")
