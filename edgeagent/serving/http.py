"""The agent's HTTP API: Open Inference Protocol v2, the edge ``/v1`` routes, metrics, OpenAPI.

``create_app`` builds one aiohttp application that the daemon serves on its Unix socket and TCP
listener. Handlers only translate between HTTP and the engine (the registry and its loaded
models); every failure the engine reports is a ``ServingError`` whose status the error middleware
turns into ``{"error": ...}``, and anything else is caught there too, so no request can take the
server down or leak into another request.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from functools import cache
from importlib import resources
from typing import Any, Protocol

import numpy as np
import yaml
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.typedefs import Middleware
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import generate_latest

from edgeagent import __version__
from edgeagent.serving import v2
from edgeagent.serving.auth import auth_middleware, over_tcp
from edgeagent.serving.classify import classify
from edgeagent.serving.errors import (
    InvalidInput,
    ModelNotFound,
    NotReady,
    PayloadTooLarge,
    ServingError,
)
from edgeagent.serving.settings import ServerSettings

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Registry(Protocol):
    """What the HTTP layer needs of ``edgeagent.models.registry.ModelRegistry``."""

    def get(self, name: str, version: str | None = None) -> Any: ...
    def index(self) -> list[dict[str, Any]]: ...
    def versions(self, name: str) -> list[str]: ...
    async def load(self, name: str) -> Any: ...
    async def unload(self, name: str) -> Any: ...


REGISTRY = web.AppKey("registry", Registry)
SETTINGS = web.AppKey("settings", ServerSettings)
METRICS = web.AppKey("metrics", CollectorRegistry)
STATUS: web.AppKey[Callable[[], dict[str, Any]]] = web.AppKey("status")
DECODE_SLOTS = web.AppKey("decode_slots", asyncio.Semaphore)

EXTENSIONS = ["binary_tensor_data", "model_repository", "statistics", "model_configuration"]
# Triton's platform names, so tools that read model metadata recognise the backend.
PLATFORMS = {"onnxruntime": "onnxruntime_onnx", "litert": "tflite", "openvino": "openvino"}
READ_CHUNK = 64 * 1024
# JSON parts larger than this are parsed on a worker thread; binary tensors never need it.
OFFLOAD_JSON_BYTES = 256 * 1024


# ---------------------------------------------------------------------------------------------
# Middleware: metrics (outermost) → errors → auth → handler


class HttpMetrics:
    """Per-route request counts, latency and errors; the route label is the route template."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "edgeagent_http_requests_total",
            "HTTP requests answered, by route template, method and status",
            ["route", "method", "status"],
            registry=registry,
        )
        self.errors = Counter(
            "edgeagent_http_errors_total",
            "HTTP requests answered with a 4xx or 5xx status",
            ["route", "status"],
            registry=registry,
        )
        self.latency = Histogram(
            "edgeagent_http_request_duration_seconds",
            "Time from request headers to response, by route template",
            ["route", "method"],
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
            registry=registry,
        )

    def middleware(self) -> Middleware:
        @web.middleware
        async def measure(request: web.Request, handler: Handler) -> web.StreamResponse:
            started = time.perf_counter()
            status = 500
            try:
                response = await handler(request)
                status = response.status
                return response
            finally:
                resource = request.match_info.route.resource
                route = resource.canonical if resource is not None else "unmatched"
                self.latency.labels(route, request.method).observe(time.perf_counter() - started)
                self.requests.labels(route, request.method, str(status)).inc()
                if status >= 400:
                    self.errors.labels(route, str(status)).inc()

        return measure


def error_json(message: str, status: int, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers)


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure becomes ``{"error": ...}`` with its status; nothing escapes as a crash."""
    try:
        return await handler(request)
    except ServingError as exc:
        headers = {"Retry-After": str(exc.retry_after)} if exc.retry_after is not None else None
        return error_json(exc.message, exc.status, headers)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        headers = {k: v for k, v in exc.headers.items() if k.lower() == "allow"}
        return error_json(f"{exc.reason}: {request.method} {request.path}", exc.status, headers)
    except Exception as exc:
        log.exception("internal error on %s %s", request.method, request.path)
        return error_json(f"internal error: {type(exc).__name__}: {exc}", 500)


# ---------------------------------------------------------------------------------------------
# Request helpers


async def read_body(request: web.Request) -> bytes:
    """The (decompressed) body, refused with 413 as soon as it passes ``max_body_bytes``.

    aiohttp decompresses gzip/deflate bodies while streaming, so counting what arrives bounds
    the decompressed size too: a small compressed bomb is stopped at the limit.
    """
    limit = request.app[SETTINGS].max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLarge(
            f"request body of {request.content_length} bytes exceeds the limit of {limit} "
            f"bytes ([server] max_body_bytes)"
        )
    parts: list[bytes] = []
    size = 0
    try:
        async for chunk in request.content.iter_chunked(READ_CHUNK):
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(
                    f"request body exceeds the limit of {limit} bytes ([server] max_body_bytes)"
                )
            parts.append(chunk)
    except (web.RequestPayloadError, HttpProcessingError) as exc:  # e.g. a corrupt gzip body
        reason = getattr(exc.__cause__, "message", None) or str(exc)
        raise InvalidInput(f"request body could not be read: {reason}") from None
    return b"".join(parts)


async def read_json_object(request: web.Request) -> dict[str, Any]:
    """An optional JSON object body: empty means ``{}`` (tritonclient sends none at times)."""
    body = await read_body(request)
    if not body.strip():
        return {}
    try:
        value = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidInput(f"request body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise InvalidInput("request body must be a JSON object")
    return value


def get_model(request: web.Request) -> Any:
    """The LoadedModel the path names (``{name}`` and optional ``{version}``)."""
    return request.app[REGISTRY].get(request.match_info["name"], request.match_info.get("version"))


def _json(data: Any) -> web.Response:
    return web.json_response(data, dumps=lambda value: json.dumps(value, default=str))


# ---------------------------------------------------------------------------------------------
# v2: health, metadata


async def live(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def server_ready(request: web.Request) -> web.Response:
    """200 when at least one model takes traffic; 400 otherwise (v2: anything but 200 = no)."""
    ready = any(entry["state"] == "READY" for entry in request.app[REGISTRY].index())
    return web.Response(status=200 if ready else 400)


async def server_metadata(request: web.Request) -> web.Response:
    return web.json_response(
        {"name": "edgeagent", "version": __version__, "extensions": EXTENSIONS}
    )


def _tensor_metadata(spec: Any) -> dict[str, Any]:
    return {"name": spec.name, "datatype": v2.datatype_of(spec.dtype), "shape": list(spec.shape)}


async def model_metadata(request: web.Request) -> web.Response:
    model = get_model(request)
    package = model.package
    return web.json_response(
        {
            "name": package.name,
            "versions": request.app[REGISTRY].versions(package.name),
            "platform": PLATFORMS.get(model.backend["runtime"], "unknown"),
            "inputs": [_tensor_metadata(spec) for spec in package.inputs],
            "outputs": [_tensor_metadata(spec) for spec in package.outputs],
        }
    )


async def model_ready(request: web.Request) -> web.Response:
    """200 when the model (version) takes traffic, 400 when it exists but does not; 404 unknown."""
    try:
        get_model(request)
    except NotReady:
        return web.Response(status=400)
    return web.Response(status=200)


def _triton_dims(spec: Any, batched: bool) -> dict[str, Any]:
    dims = list(spec.shape[1:] if batched else spec.shape)
    return {"name": spec.name, "data_type": "TYPE_" + v2.datatype_of(spec.dtype), "dims": dims}


async def model_config(request: web.Request) -> web.Response:
    """Triton-style configuration (what ``tritonclient.get_model_config`` reads)."""
    model = get_model(request)
    package = model.package
    batched = model.max_batch_size > 0
    runtime = model.backend["runtime"]
    return web.json_response(
        {
            "name": package.name,
            "platform": PLATFORMS.get(runtime, "unknown"),
            "backend": runtime,
            "max_batch_size": model.max_batch_size,
            "input": [_triton_dims(spec, batched) for spec in package.inputs],
            "output": [_triton_dims(spec, batched) for spec in package.outputs],
            "dynamic_batching": {
                "max_queue_delay_microseconds": int(package.serving.max_queue_delay_ms * 1000)
            },
            "version_policy": {"specific": {"versions": [model.version]}},
        }
    )


# ---------------------------------------------------------------------------------------------
# v2: infer


def _engine_options(parameters: dict[str, Any], settings: ServerSettings) -> dict[str, Any]:
    """Triton's request parameters ``priority`` (1 = most urgent) and ``timeout`` (µs)."""
    options: dict[str, Any] = {}
    priority = parameters.get("priority")
    if priority is not None:
        if not isinstance(priority, int) or isinstance(priority, bool) or priority < 0:
            raise InvalidInput(
                f"parameters.priority must be a non-negative integer, got {priority!r}"
            )
        if priority > 0:  # 0 is Triton's "default priority"
            options["priority"] = priority
    timeout = parameters.get("timeout")
    if timeout is not None:
        if not isinstance(timeout, int) or isinstance(timeout, bool) or timeout <= 0:
            raise InvalidInput(
                f"parameters.timeout must be a positive integer (µs), got {timeout!r}"
            )
        options["timeout_s"] = min(timeout / 1e6, settings.request_timeout_s)
    return options


def _json_size(body_length: int, header: str | None) -> int:
    """How many bytes of the body are JSON (a bad header is reported later, by the codec)."""
    if header is None:
        return body_length
    try:
        return min(int(header), body_length)
    except ValueError:
        return 0


async def infer(request: web.Request) -> web.Response:
    model = get_model(request)
    package = model.package
    body = await read_body(request)
    header = request.headers.get(v2.HEADER_LENGTH)
    if header is not None and header.strip() == "0":
        if len(package.inputs) != 1:
            raise InvalidInput(
                f"a raw body ({v2.HEADER_LENGTH}: 0) needs a model with exactly one input; "
                f"{package.name!r} has {len(package.inputs)}"
            )
        decoded = v2.decode_raw_request(body, package.inputs[0])
    elif _json_size(len(body), header) > OFFLOAD_JSON_BYTES:
        # Parsing megabytes of JSON takes tens of ms; off the loop, other requests keep moving.
        decoded = await asyncio.to_thread(v2.decode_request, body, header)
    else:
        decoded = v2.decode_request(body, header)
    specs = {spec.name: spec for spec in package.outputs}
    chosen = v2.select_outputs(decoded, list(specs))
    options = _engine_options(decoded.parameters, request.app[SETTINGS])
    results = await model.infer(decoded.inputs, **options)
    # Answer in the datatype the metadata advertises, whatever precision the variant computed in.
    outputs = [
        (name, np.asarray(results[name]).astype(specs[name].dtype, copy=False), binary)
        for name, binary in chosen
    ]
    payload, length = v2.encode_response(
        model_name=package.name, model_version=model.version, outputs=outputs, request_id=decoded.id
    )
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


# ---------------------------------------------------------------------------------------------
# v2: repository and statistics extensions


async def repository_index(request: web.Request) -> web.Response:
    options = await read_json_object(request)
    ready_only = options.get("ready", False)
    if not isinstance(ready_only, bool):
        raise InvalidInput("'ready' must be true or false")
    index = request.app[REGISTRY].index()
    return _json([entry for entry in index if not ready_only or entry["state"] == "READY"])


async def repository_load(request: web.Request) -> web.Response:
    await read_json_object(request)  # parameters (config overrides) are not supported: ignored
    await request.app[REGISTRY].load(request.match_info["name"])
    return web.Response(status=200)


async def repository_unload(request: web.Request) -> web.Response:
    await read_json_object(request)  # unload_dependents: there are no dependents here
    await request.app[REGISTRY].unload(request.match_info["name"])
    return web.Response(status=200)


def _version_stats(registry: Any, name: str, versions: list[str]) -> list[dict[str, Any]]:
    """Statistics of the versions that are loaded; unloaded ones have nothing to report."""
    stats = []
    for version in versions:
        try:
            model = registry.get(name, version)
        except (NotReady, ModelNotFound):
            continue
        stats.append(model.stats.to_v2(name, model.version))
    return stats


async def model_stats(request: web.Request) -> web.Response:
    registry = request.app[REGISTRY]
    name = request.match_info.get("name")
    version = request.match_info.get("version")
    if name is None:
        names = sorted({entry["name"] for entry in registry.index()})
        stats = [s for n in names for s in _version_stats(registry, n, registry.versions(n))]
    elif version is None:
        stats = _version_stats(registry, name, registry.versions(name))
    else:
        model = get_model(request)
        stats = [model.stats.to_v2(name, model.version)]
    return web.json_response({"model_stats": stats})


# ---------------------------------------------------------------------------------------------
# Edge API: classify, status, metrics, OpenAPI


async def classify_image(request: web.Request) -> web.Response:
    model = get_model(request)
    image = await read_body(request)
    answer = await classify(model, image, request.query.get("top_k"), request.app[DECODE_SLOTS])
    return web.json_response(answer)


async def status_report(request: web.Request) -> web.Response:
    return _json(request.app[STATUS]())


async def metrics_text(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


@cache
def openapi_document() -> dict[str, Any]:
    """The OpenAPI document, parsed once from the YAML kept next to this module."""
    text = resources.files("edgeagent.serving").joinpath("openapi.yaml").read_text("utf-8")
    return yaml.safe_load(text)


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(openapi_document())


# ---------------------------------------------------------------------------------------------


def _model_routes(prefix: str) -> list[web.RouteDef]:
    """The routes that exist both as ``/v2/models/{name}`` and ``…/versions/{version}``."""
    return [
        web.get(prefix, model_metadata),
        web.get(f"{prefix}/ready", model_ready),
        web.get(f"{prefix}/config", model_config),
        web.get(f"{prefix}/stats", model_stats),
        web.post(f"{prefix}/infer", infer),
    ]


def create_app(
    registry: Any,
    *,
    settings: ServerSettings,
    metrics: CollectorRegistry,
    status: Callable[[], dict],
) -> web.Application:
    """The HTTP application over ``registry`` (a ModelRegistry); serve it on any listener."""
    http_metrics = HttpMetrics(metrics)
    app = web.Application(
        middlewares=[http_metrics.middleware(), errors_middleware, auth_middleware(settings)],
        client_max_size=settings.max_body_bytes,
    )
    app[REGISTRY] = registry
    app[SETTINGS] = settings
    app[METRICS] = metrics
    app[STATUS] = status
    # A decoded image may take ~120 MB (40 Mpx RGB): decode no more at once than there are
    # inference threads, so a burst of large uploads cannot exhaust a small board's memory.
    app[DECODE_SLOTS] = asyncio.Semaphore(settings.worker_threads)
    app.add_routes(
        [
            web.get("/v2/health/live", live),
            web.get("/v2/health/ready", server_ready),
            web.get("/v2", server_metadata),
            web.get("/v2/models/stats", model_stats),
            *_model_routes("/v2/models/{name}"),
            *_model_routes("/v2/models/{name}/versions/{version}"),
            web.post("/v2/repository/index", repository_index),
            web.post("/v2/repository/models/{name}/load", repository_load),
            web.post("/v2/repository/models/{name}/unload", repository_unload),
            web.post("/v1/models/{name}/classify", classify_image),
            web.get("/v1/status", status_report),
            web.get("/metrics", metrics_text),
            web.get("/openapi.json", openapi),
        ]
    )
    return app
