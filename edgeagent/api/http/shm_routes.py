"""The v2 system shared-memory extension over HTTP: register, unregister and status of regions.

Paths and bodies are Triton's (what ``tritonclient.http`` sends): ``POST
/v2/systemsharedmemory/region/{name}/register`` with ``{"key", "offset", "byte_size"}``,
``…/unregister`` (every region without a name), ``GET /v2/systemsharedmemory[/region/{name}]
/status``. Inference requests name the regions in their tensors' parameters (``v2`` codec).
Every call acts on the caller's own regions only (``api.shm.callers``): "unregister all" and the
status list included.
"""

from __future__ import annotations

from aiohttp import web

from edgeagent.api.http.app_keys import SHARED_MEMORY
from edgeagent.api.http.body import read_json_object
from edgeagent.api.shm.callers import http_caller


async def register(request: web.Request) -> web.Response:
    body = await read_json_object(request)
    request.app[SHARED_MEMORY].register(
        http_caller(request),
        request.match_info["name"],
        body.get("key"),  # type: ignore[arg-type]  # the registry checks every type
        body.get("offset", 0),
        body.get("byte_size"),  # type: ignore[arg-type]
    )
    return web.Response(status=200)


async def unregister(request: web.Request) -> web.Response:
    request.app[SHARED_MEMORY].unregister(http_caller(request), request.match_info.get("name"))
    return web.Response(status=200)


async def status(request: web.Request) -> web.Response:
    regions = request.app[SHARED_MEMORY]
    return web.json_response(regions.status(http_caller(request), request.match_info.get("name")))


def shm_routes() -> list[web.RouteDef]:
    prefix = "/v2/systemsharedmemory"
    return [
        web.get(f"{prefix}/status", status),
        web.get(prefix + "/region/{name}/status", status),
        web.post(prefix + "/region/{name}/register", register),
        web.post(prefix + "/region/{name}/unregister", unregister),
        web.post(f"{prefix}/unregister", unregister),
    ]
