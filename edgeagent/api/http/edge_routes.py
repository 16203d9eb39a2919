"""The edge convenience API: classify an image, the agent's status, metrics, OpenAPI."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST
from prometheus_client.exposition import generate_latest

from edgeagent.api.http.app_keys import DATAPLANE, LANGUAGE, METRICS, STATUS
from edgeagent.api.http.body import received_body


async def classify_image(request: web.Request) -> web.Response:
    name, version = request.match_info["name"], request.match_info.get("version")
    async with received_body(request) as image:
        answer = await request.app[DATAPLANE].classify(
            name, version, image, request.query.get("top_k")
        )
    return web.json_response(answer)


async def status_report(request: web.Request) -> web.Response:
    document = request.app[STATUS]()
    language = request.app.get(LANGUAGE)
    if language is not None:  # KV-cache use, sequences running and waiting, tokens/s
        document = {**document, "language": language.status()}
    return web.json_response(document, dumps=lambda value: json.dumps(value, default=str))


async def metrics_text(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


@cache
def openapi_document() -> dict[str, Any]:
    """The OpenAPI document, parsed once from the YAML kept next to this module (PyYAML is
    imported then: a daemon that is never asked for it does not hold it)."""
    import yaml

    text = resources.files("edgeagent.api.http").joinpath("openapi.yaml").read_text("utf-8")
    return yaml.safe_load(text)


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(openapi_document())


def edge_routes() -> list[web.RouteDef]:
    return [
        web.post("/v1/models/{name}/classify", classify_image),
        web.get("/v1/status", status_report),
        web.get("/metrics", metrics_text),
        web.get("/openapi.json", openapi),
    ]
