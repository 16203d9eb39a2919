"""The agent's HTTP application: middleware, body limits, and the routes of every API.

``create_app`` builds one aiohttp application that the daemon serves on its Unix socket and TCP
listener. Routes live in ``v2_routes`` (Open Inference Protocol) and ``edge_routes`` (classify,
status, metrics, OpenAPI); both only translate between HTTP and the engine's data plane. Every
failure the engine reports is a ``ServingError`` whose status the error middleware turns into
``{"error": ...}``, and anything else is caught there too, so no request can take the server
down or leak into another request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import CollectorRegistry, Counter, Histogram

from edgeagent.api.auth import auth_middleware
from edgeagent.api.http.app_keys import (
    BUDGETS,
    DATAPLANE,
    JSON_DECODER,
    JSON_HELPER,
    LANGUAGE,
    METRICS,
    SETTINGS,
    SHARED_MEMORY,
    STATUS,
    UPDATE_LOCKS,
    LanguagePlane,
)
from edgeagent.api.http.body import BodyTooSlow
from edgeagent.api.http.deepstack_routes import deepstack_routes
from edgeagent.api.http.detect_routes import detect_routes
from edgeagent.api.http.edge_routes import edge_routes
from edgeagent.api.http.listener_guard import agent_guard
from edgeagent.api.http.lock_routes import lock_routes
from edgeagent.api.http.ollama_routes import ollama_routes
from edgeagent.api.http.openai_routes import openai_errors, openai_routes
from edgeagent.api.http.shm_routes import shm_routes
from edgeagent.api.http.v2_routes import v2_routes
from edgeagent.api.jsonparse.helper import JsonHelper
from edgeagent.api.settings import ServerSettings
from edgeagent.api.shm.regions import SharedMemoryRegistry
from edgeagent.api.shm.settings import SharedMemorySettings
from edgeagent.engine.budget import Budget
from edgeagent.engine.dataplane import DataPlane
from edgeagent.engine.errors import ServingError
from edgeagent.httpguard import security_headers
from edgeagent.updates.locks import UpdateLocks
from edgeagent.updates.settings import UpdateSettings

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# ---------------------------------------------------------------------------------------------
# Middleware: metrics (outermost) → errors → browser checks → auth → handler; every answer
# gets the guard's security headers as it is prepared


class HttpMetrics:
    """Per-route request counts (errors are their 4xx/5xx ``status``) and latency.

    The route label is the route template, so the label set stays bounded.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "edgeagent_http_requests_total",
            "HTTP requests answered, by route template, method and status",
            ["route", "method", "status"],
            registry=registry,
        )
        self.latency = Histogram(
            "edgeagent_http_request_duration_seconds",
            "Time from request headers to response, by route template",
            ["route", "method"],
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10),
            registry=registry,
        )
        # Bounded like the label sets: route templates × methods × statuses.
        self._children: dict[tuple[str, str, int], tuple[Histogram, Counter]] = {}

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
                latency, requests = self._series(route, request.method, status)
                latency.observe(time.perf_counter() - started)
                requests.inc()

        return measure

    def _series(self, route: str, method: str, status: int) -> tuple[Histogram, Counter]:
        """The labelled children, looked up once per label set (``labels()`` takes a lock)."""
        key = (route, method, status)
        series = self._children.get(key)
        if series is None:
            series = self._children[key] = (
                self.latency.labels(route, method),
                self.requests.labels(route, method, str(status)),
            )
        return series


def error_json(message: str, status: int, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=headers)


@web.middleware
async def errors_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure becomes ``{"error": ...}`` with its status; nothing escapes as a crash."""
    try:
        return await handler(request)
    except BodyTooSlow as exc:
        return await _answer_then_close(request, error_json(exc.message, exc.status))
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


async def _answer_then_close(request: web.Request, response: web.Response) -> web.Response:
    """Send ``response`` and drop the connection at once: aiohttp would otherwise keep reading
    (lingering) the rest of a body from a client already known to be too slow."""
    response.force_close()
    await response.prepare(request)
    await response.write_eof()
    request.protocol.force_close()
    return response


def create_app(
    dataplane: DataPlane,
    *,
    settings: ServerSettings,
    metrics: CollectorRegistry,
    status: Callable[[], dict],
    shared_memory: SharedMemoryRegistry | None = None,
    language: LanguagePlane | None = None,
    update_locks: UpdateLocks | None = None,
) -> web.Application:
    """The HTTP application over ``dataplane``; serve it on any listener.

    ``shared_memory`` is the daemon's region registry (shared with gRPC, released by the
    daemon); without one the app keeps its own and releases it on cleanup. ``language`` is the
    language plane: given, the OpenAI and Ollama routes are served over it. ``update_locks``
    (the daemon's, which its updater waits on) serves ``/v1/update-lock``; without them the
    app keeps its own, with the default limits.
    """
    http_metrics = HttpMetrics(metrics)
    # OpenAI's clients read their own error shape: its middleware sits inside the agent's (which
    # still catches what it lets through) and outside the guard and token check it re-shapes.
    shapes = [openai_errors] if language is not None else []
    app = web.Application(
        middlewares=[
            http_metrics.middleware(),
            errors_middleware,
            *shapes,
            agent_guard(settings).middleware(),
            auth_middleware(settings),
        ],
        client_max_size=settings.max_body_bytes,
    )
    app.on_response_prepare.append(security_headers)
    app[DATAPLANE] = dataplane
    app[SETTINGS] = settings
    app[METRICS] = metrics
    app[STATUS] = status
    app[BUDGETS] = {kind: Budget(settings.max_decoding_bytes) for kind in ("unix", "tcp")}
    if shared_memory is None:
        shared_memory = SharedMemoryRegistry(SharedMemorySettings())
        app.on_cleanup.append(lambda _: _close_regions(shared_memory))
    app[SHARED_MEMORY] = shared_memory
    app[JSON_DECODER] = decoder = json_decoder()
    app[JSON_HELPER] = helper = JsonHelper(settings.json_helper_max_bytes, decoder)
    app.on_cleanup.append(lambda _: helper.close())
    app.on_cleanup.append(lambda _: _shut_down(decoder))
    app.add_routes(
        [*v2_routes(), *edge_routes(), *detect_routes(), *deepstack_routes(), *shm_routes()]
    )
    defaults = UpdateSettings()
    app[UPDATE_LOCKS] = update_locks or UpdateLocks(defaults.max_lock_hold_s, defaults.max_locks)
    app.add_routes(lock_routes())
    if language is not None:
        app[LANGUAGE] = language
        app.add_routes([*openai_routes(), *ollama_routes()])
    return app


def json_decoder() -> ThreadPoolExecutor:
    """One thread for decoding large JSON bodies off the event loop: those the JSON helper
    process does not take are parsed here, and heavy helper replies are read here.

    One, not a pool: the parser holds the GIL for the whole body (several ms for a 224×224×3
    float tensor), so a second parsing thread cannot run beside it and only adds GIL hand-offs;
    with the default executor's five threads, v2 JSON at c=16 served 65 req/s against 72 with
    one (medians of four alternating rounds, 19.2 against 21.1 ms of daemon CPU a request).
    """
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="edgeagent-json")


async def _shut_down(executor: ThreadPoolExecutor) -> None:
    executor.shutdown(wait=False, cancel_futures=True)


async def _close_regions(regions: SharedMemoryRegistry) -> None:
    regions.close()
