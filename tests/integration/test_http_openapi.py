"""The OpenAPI document in the repo is valid, served as JSON, and lists exactly the app's routes."""

from __future__ import annotations

import yaml
from openapi_spec_validator import validate
from prometheus_client import CollectorRegistry

from edgeagent.api.http.app import create_app
from edgeagent.api.http.edge_routes import openapi_document
from edgeagent.api.settings import ServerSettings
from tests.support.helpers import REPO
from tests.support.http_agent import tcp_session, tiny_agent

SOURCE = REPO / "edgeagent" / "api" / "http" / "openapi.yaml"
METHODS = {"get", "post", "put", "delete", "patch"}


def _app_routes() -> set[tuple[str, str]]:
    # Given a language plane, the app serves the OpenAI and Ollama routes too (all of them
    # documented); registering routes does not call the plane.
    app = create_app(
        object(),
        settings=ServerSettings(),
        metrics=CollectorRegistry(),
        status=dict,
        language=object(),  # type: ignore[arg-type]
    )
    return {
        (route.method.lower(), resource.canonical)
        for resource in app.router.resources()
        for route in resource
        if route.method != "HEAD"  # aiohttp adds HEAD to every GET by itself
    }


def _documented_routes(document: dict) -> set[tuple[str, str]]:
    return {
        (method, path)
        for path, item in document["paths"].items()
        for method in item
        if method in METHODS
    }


def test_the_document_is_valid_openapi() -> None:
    validate(yaml.safe_load(SOURCE.read_text()))


def test_every_route_is_documented_and_every_documented_route_exists() -> None:
    routes, documented = _app_routes(), _documented_routes(openapi_document())
    assert routes - documented == set(), "routes missing from openapi.yaml"
    assert documented - routes == set(), "openapi.yaml documents routes the app lacks"


async def test_served_json_is_the_yaml_source(tmp_path) -> None:
    with tiny_agent(tmp_path) as agent:
        async with (
            tcp_session(agent) as http,
            http.get("/openapi.json") as response,
        ):
            assert response.status == 200
            assert await response.json() == yaml.safe_load(SOURCE.read_text())
