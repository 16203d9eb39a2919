"""Open Inference Protocol (KServe v2) over HTTP: health, metadata, infer, repository, stats.

Each handler decodes the wire format (``edgeagent.api.v2``), makes one data-plane call, and
frames the answer; no engine decision (model lookup, output choice, options) is made here.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from edgeagent.api import v2
from edgeagent.api.auth import admin_scope, over_tcp
from edgeagent.api.http.app_keys import DATAPLANE, JSON_DECODER, JSON_HELPER, SHARED_MEMORY
from edgeagent.api.http.body import read_json_object, received_body
from edgeagent.api.shm.callers import http_caller
from edgeagent.engine.dataplane import DataPlane
from edgeagent.engine.errors import InvalidInput

# JSON parts larger than this are parsed off the event loop; binary tensors never need it.
OFFLOAD_JSON_BYTES = 256 * 1024


def _names(request: web.Request) -> tuple[str, str | None]:
    return request.match_info["name"], request.match_info.get("version")


def _json(data: Any) -> web.Response:
    return web.json_response(data, dumps=lambda value: json.dumps(value, default=str))


async def live(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def server_ready(request: web.Request) -> web.Response:
    """200 when at least one model takes traffic; 400 otherwise (v2: anything but 200 = no)."""
    return web.Response(status=200 if request.app[DATAPLANE].ready() else 400)


async def server_metadata(request: web.Request) -> web.Response:
    return web.json_response(request.app[DATAPLANE].server_metadata())


async def model_metadata(request: web.Request) -> web.Response:
    return web.json_response(request.app[DATAPLANE].model_metadata(*_names(request)))


async def model_ready(request: web.Request) -> web.Response:
    """200 when the model (version) takes traffic, 400 when it exists but does not; 404 unknown."""
    return web.Response(status=200 if request.app[DATAPLANE].model_ready(*_names(request)) else 400)


async def model_config(request: web.Request) -> web.Response:
    return web.json_response(request.app[DATAPLANE].model_config(*_names(request)))


def _json_size(body_length: int, header: str | None) -> int:
    """How many bytes of the body are JSON (a bad header is reported later, by the codec)."""
    if header is None:
        return body_length
    try:
        return min(int(header), body_length)
    except ValueError:
        return 0


async def infer(request: web.Request) -> web.Response:
    dataplane = request.app[DATAPLANE]
    regions = request.app[SHARED_MEMORY].of(lambda: http_caller(request))
    name, version = _names(request)
    header = request.headers.get(v2.HEADER_LENGTH)
    raw = header is not None and header.strip() == "0"
    async with received_body(request, lambda size: 0 if raw else _json_size(size, header)) as body:
        if raw:
            decoded = _decode_raw(dataplane, name, version, body)
        elif _json_size(len(body), header) > OFFLOAD_JSON_BYTES:
            decoded = await _decode_large_json(request, body, header)
        else:
            decoded = v2.decode_request(body, header, regions)
        del body
        answer = await dataplane.infer(decoded, name, version)
        payload, length = v2.encode_response(answer, decoded, regions)
    if length is None:
        response = web.Response(body=payload, content_type="application/json")
    else:
        response = web.Response(
            body=payload,
            content_type="application/octet-stream",
            headers={v2.HEADER_LENGTH: str(length)},
        )
    if over_tcp(request):
        # Only where bytes cross a network: on the Unix socket compressing is pure CPU cost
        # (≈1 ms for a 1000-class JSON answer here), and aiohttp/requests clients ask for it
        # by default. aiohttp then compresses when Accept-Encoding names gzip or deflate.
        response.enable_compression()
    return response


async def _decode_large_json(
    request: web.Request, body: bytes, header: str | None
) -> v2.WireRequest:
    """Parsing megabytes of JSON takes milliseconds: in the JSON helper process when it takes
    the body, else on the app's JSON thread; never on the event loop."""
    json_part, tail = v2.split_body(body, header)
    parsed = await request.app[JSON_HELPER].parse(json_part)
    loop = asyncio.get_running_loop()
    decoder = request.app[JSON_DECODER]
    regions = request.app[SHARED_MEMORY].of(lambda: http_caller(request))
    if parsed is None:
        return await loop.run_in_executor(decoder, v2.decode_request, body, header, regions)
    if parsed.light:
        return v2.decode_message(parsed.message, tail, regions)
    return await loop.run_in_executor(decoder, v2.decode_message, parsed.message, tail, regions)


def _decode_raw(
    dataplane: DataPlane, name: str, version: str | None, body: bytes
) -> v2.WireRequest:
    """Triton's raw body (``Inference-Header-Content-Length: 0``): one input's bytes, which only
    the model's metadata can give a name, datatype and shape."""
    package = dataplane.model(name, version).package
    if len(package.inputs) != 1:
        raise InvalidInput(
            f"a raw body ({v2.HEADER_LENGTH}: 0) needs a model with exactly one input; "
            f"{package.name!r} has {len(package.inputs)}"
        )
    return v2.decode_raw_request(body, package.inputs[0])


async def repository_index(request: web.Request) -> web.Response:
    options = await read_json_object(request)
    ready_only = options.get("ready", False)
    if not isinstance(ready_only, bool):
        raise InvalidInput("'ready' must be true or false")
    return _json(request.app[DATAPLANE].repository_index(ready_only))


@admin_scope
async def repository_load(request: web.Request) -> web.Response:
    await read_json_object(request)  # parameters (config overrides) are not supported: ignored
    await request.app[DATAPLANE].load(request.match_info["name"])
    return web.Response(status=200)


@admin_scope
async def repository_unload(request: web.Request) -> web.Response:
    await read_json_object(request)  # unload_dependents: there are no dependents here
    await request.app[DATAPLANE].unload(request.match_info["name"])
    return web.Response(status=200)


async def model_stats(request: web.Request) -> web.Response:
    name, version = request.match_info.get("name"), request.match_info.get("version")
    return web.json_response({"model_stats": request.app[DATAPLANE].statistics(name, version)})


def _model_routes(prefix: str) -> list[web.RouteDef]:
    """The routes that exist both as ``/v2/models/{name}`` and ``…/versions/{version}``."""
    return [
        web.get(prefix, model_metadata),
        web.get(f"{prefix}/ready", model_ready),
        web.get(f"{prefix}/config", model_config),
        web.get(f"{prefix}/stats", model_stats),
        web.post(f"{prefix}/infer", infer),
    ]


def v2_routes() -> list[web.RouteDef]:
    return [
        web.get("/v2/health/live", live),
        web.get("/v2/health/ready", server_ready),
        web.get("/v2", server_metadata),
        web.get("/v2/models/stats", model_stats),
        *_model_routes("/v2/models/{name}"),
        *_model_routes("/v2/models/{name}/versions/{version}"),
        web.post("/v2/repository/index", repository_index),
        web.post("/v2/repository/models/{name}/load", repository_load),
        web.post("/v2/repository/models/{name}/unload", repository_unload),
    ]
