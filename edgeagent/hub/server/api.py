"""The hub's REST API (``/api/v1``): devices, their history, releases and deployments.

Handlers only translate between HTTP and the database layer (``fleetdb``, ``releasedb``,
``deploydb``, ``deployreads``); every refusal is a JSON
``{"error": ...}`` with a 4xx status, and nothing is written unless the whole request is valid.
Each route is an ``inputs.Operation``: its parameters and body are checked against their
schemas before the handler runs, and the document served at ``/openapi.json`` is
``openapi.yaml`` (summaries, answers) with those same schemas filled in (``inputs.document``).
"""

from __future__ import annotations

import asyncio
import contextlib
from importlib import resources
from typing import Any

from aiohttp import web

from edgeagent.httpguard import Guard, security_headers
from edgeagent.hub.blobs import BlobStore
from edgeagent.hub.policy import PolicyError, RolloutPolicy, StagedPolicy
from edgeagent.hub.server import (
    api_inputs,
    deploydb,
    deployreads,
    fleetdb,
    inputs,
    releasedb,
    samples_api,
)
from edgeagent.hub.server.auth import TOKENS, Tokens, auth_middleware, needs
from edgeagent.hub.server.context import (
    CONTEXT,
    BadRequest,
    HubContext,
    context_of,
    query_filter,
    query_page,
)
from edgeagent.hub.server.dashboard.fleet_pages import dashboard_routes
from edgeagent.hub.server.dashboard.sample_pages import sample_routes
from edgeagent.hub.server.database import head_revision
from edgeagent.hub.server.releasedb import DeploymentError
from edgeagent.hub.server.settings import ServerSettings
from edgeagent.hub.server.targets import TargetSpec
from edgeagent.hub.server.upload_gate import UploadRefused, check_upload


@web.middleware
async def errors_middleware(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        return await handler(request)
    except BadRequest as exc:
        return web.json_response({"error": exc.message}, status=exc.status)
    except web.HTTPException as exc:  # aiohttp's own (404 route, 405, 413 body too large)
        if exc.status < 400:
            raise
        kept = {k: v for k, v in exc.headers.items() if k in ("Allow", "WWW-Authenticate")}
        return web.json_response({"error": exc.reason}, status=exc.status, headers=kept)


async def _json_body(request: web.Request) -> dict[str, Any]:
    """The route's body, already checked against its schema (``inputs.Operation.route``)."""
    return inputs.body_of(request)


# ---- health and devices ------------------------------------------------------------------


async def health(request: web.Request) -> web.Response:
    """Whether the retained reports were read (``?wait=S`` waits for it) and how many."""
    hub = context_of(request)
    wait = inputs.values_of(request)["wait"]
    if wait and not hub.ingest.synced.is_set():
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(hub.ingest.synced.wait(), wait)
    async with hub.engine.connect() as connection:
        counts = await fleetdb.fleet_counts(connection)
    return web.json_response(
        {
            "synced": hub.ingest.synced.is_set(),
            "retained_devices": hub.ingest.retained_devices,
            "sync_s": hub.ingest.sync_seconds,
            "devices": sum(counts.values()),
            "counts": counts,
            "ingest": hub.ingest.stats,
            "database": hub.engine.dialect.name,
            "schema_revision": head_revision(),
            "controller": _controller(hub),
        }
    )


def _controller(hub: HubContext) -> dict[str, object]:
    """Whether this replica runs the rollout controller now (replicas on one database: the
    one holding the lease), its name in the lease and its fencing token."""
    lead = hub.leadership
    if lead is None:
        return {"leading": True, "replica": "", "token": None}
    return {"leading": lead.leading(), "replica": lead.holder, "token": lead.token}


async def _long_poll(request: web.Request) -> None:
    """``?wait=S&after=N``: return once anything changed since version N (or after S)."""
    hub = context_of(request)
    values = inputs.values_of(request)
    if values["wait"]:
        after = hub.changes.version if values["after"] is None else values["after"]
        await hub.changes.wait_past(after, values["wait"])


async def list_devices(request: web.Request) -> web.Response:
    """One page of the fleet table; ``?wait=S&after=N`` long-polls for the next change."""
    hub = context_of(request)
    where = query_filter(request)
    limit, offset = query_page(request)
    await _long_poll(request)
    version = hub.changes.version  # before the read: a change during it is then not lost
    async with hub.engine.connect() as connection:
        page = await fleetdb.list_devices(connection, where, limit=limit, offset=offset)
    page["synced"] = hub.ingest.synced.is_set()
    page["version"] = version
    return web.json_response(page)


async def get_device(request: web.Request) -> web.Response:
    """One device; ``?wait=S&after=N`` long-polls for its next change."""
    hub = context_of(request)
    await _long_poll(request)
    version = hub.changes.version  # before the read (see list_devices)
    async with hub.engine.connect() as connection:
        device = await fleetdb.get_device(connection, request.match_info["device_id"])
    if device is None:
        raise BadRequest(404, f"no device {request.match_info['device_id']!r}")
    device["version"] = version
    return web.json_response(device)


async def device_history(request: web.Request) -> web.Response:
    hub = context_of(request)
    values = inputs.values_of(request)
    limit, before, kind = values["limit"], values["before"], values["kind"] or ""
    async with hub.engine.connect() as connection:
        device_id = values["device_id"]
        if await fleetdb.get_device(connection, device_id) is None:
            raise BadRequest(404, f"no device {device_id!r}")
        rows = await fleetdb.device_history(
            connection, device_id, limit=limit, before=before, kind=kind
        )
    return web.json_response({"device_id": device_id, "events": rows})


# ---- releases ----------------------------------------------------------------------------


@needs("admin")
async def create_release(request: web.Request) -> web.Response:
    """The body is a ``*.release.json`` exactly as ``hub sign`` wrote it; stored only once the
    devices' own checks pass (``verify.check_upload``), in the same transaction."""
    hub = context_of(request)
    envelope = await request.read()
    try:
        async with hub.engine.begin() as connection:
            manifest = await check_upload(connection, envelope, hub.trust_file)
            row, created = await releasedb.add_release(connection, envelope, manifest)
    except UploadRefused as exc:
        raise BadRequest(422, str(exc)) from exc
    return web.json_response(releasedb.release_view(row), status=201 if created else 200)


async def list_releases(request: web.Request) -> web.Response:
    async with context_of(request).engine.connect() as connection:
        rows = await releasedb.list_releases(connection, inputs.values_of(request)["model"] or "")
    return web.json_response({"releases": rows})


async def _release(request: web.Request) -> dict[str, Any]:
    release_id = inputs.values_of(request)["release_id"]
    async with context_of(request).engine.connect() as connection:
        row = await releasedb.get_release(connection, release_id)
    if row is None:
        raise BadRequest(404, f"no release {release_id}")
    return row


async def get_release(request: web.Request) -> web.Response:
    return web.json_response(releasedb.release_view(await _release(request)))


async def release_envelope(request: web.Request) -> web.Response:
    row = await _release(request)
    return web.Response(body=row["envelope"], content_type="application/json")


# ---- deployments -------------------------------------------------------------------------


def _policy(body: dict[str, Any], settings: ServerSettings) -> RolloutPolicy:
    """The body's rollout parameters (``hub/policy/`` checks them), capped by ``--max-wait``."""
    try:
        return StagedPolicy.from_fields(body, max_stage_timeout_s=settings.max_wait_s)
    except PolicyError as exc:
        raise BadRequest(422, str(exc)) from exc


def _targets(body: dict[str, Any]) -> TargetSpec:
    """The body's targets; their types were checked with ``api_inputs.new_deployment``."""
    return TargetSpec(
        group=body.get("group", ""),
        device_ids=tuple(body.get("devices", [])),
        profile=body.get("profile", ""),
    )


async def _pick_release(connection: Any, body: dict[str, Any]) -> dict[str, Any]:
    if "release_id" in body:
        release = await releasedb.get_release(connection, body["release_id"])
    elif "model" in body and "version" in body:
        release = await releasedb.find_release(connection, body["model"], body["version"])
    else:
        raise BadRequest(422, "name the release: 'release_id', or 'model' and 'version'")
    if release is None:
        raise BadRequest(404, "no such release on the hub: POST it to /api/v1/releases first")
    return release


async def _deployment_response(
    request: web.Request, deployment_id: str, status: int = 200
) -> web.Response:
    """The deployment with one page of its devices (``?limit=&offset=``, counts always whole)."""
    hub = context_of(request)
    limit, offset = query_page(request)
    version = hub.changes.version  # before the read: a change during it is then not lost
    async with hub.engine.connect() as connection:
        found = await deployreads.get_deployment(
            connection, deployment_id, device_limit=limit, device_offset=offset
        )
    if found is None:
        raise BadRequest(404, f"no deployment {deployment_id!r}")
    found["version"] = version
    return web.json_response(found, status=status)


@needs("admin")
async def create_deployment(request: web.Request) -> web.Response:
    hub = context_of(request)
    body = await _json_body(request)
    policy, targets = _policy(body, hub.settings), _targets(body)
    try:
        async with hub.engine.begin() as connection:
            release = await _pick_release(connection, body)
            deployment_id = await deploydb.create_deployment(
                connection,
                release,
                targets,
                policy,
                signs=bool(hub.settings.release_keys),
                stage_windows=body.get("stage_windows", []),
            )
    except DeploymentError as exc:
        raise BadRequest(exc.status, exc.message) from exc
    hub.wake_controller()
    await hub.changes.bump()
    return await _deployment_response(request, deployment_id, 201)


async def list_deployments(request: web.Request) -> web.Response:
    hub = context_of(request)
    values = inputs.values_of(request)
    state, limit, offset = values["state"] or "", values["limit"], values["offset"]
    async with hub.engine.connect() as connection:
        rows = await deployreads.list_deployments(
            connection, state=state, limit=limit, offset=offset
        )
    return web.json_response({"deployments": rows})


async def get_deployment(request: web.Request) -> web.Response:
    """``?wait=S&after=N``: answer as soon as anything changed since version N (long poll)."""
    await _long_poll(request)
    return await _deployment_response(request, request.match_info["deployment_id"])


@needs("admin")
async def act_on_deployment(request: web.Request) -> web.Response:
    """pause, resume or abort (``{"reason": ...}`` optional)."""
    hub = context_of(request)
    action = request.match_info["action"]
    reason = (await _json_body(request)).get("reason", "")
    if action == "abort" and not reason:
        reason = "aborted by an operator"
    try:
        async with hub.engine.begin() as connection:
            await deploydb.move(connection, request.match_info["deployment_id"], action, reason)
    except DeploymentError as exc:
        raise BadRequest(exc.status, exc.message) from exc
    hub.wake_controller()
    await hub.changes.bump()
    return await _deployment_response(request, request.match_info["deployment_id"])


@needs("admin")
async def rollback_deployment(request: web.Request) -> web.Response:
    """Stop this deployment and send ``{"version": V}`` of the same model to every device it
    reached; answers the new deployment (201)."""
    hub = context_of(request)
    body = await _json_body(request)
    version = body.get("version")
    if not isinstance(version, str) or not version:
        raise BadRequest(422, 'say which version to roll back to: {"version": "1.0.0"}')
    policy = _policy({"stages_pct": [100], **body}, hub.settings)
    deployment_id = request.match_info["deployment_id"]
    signs = bool(hub.settings.release_keys)  # re-signs the old release with a fresh serial
    try:
        async with hub.engine.begin() as connection:
            new_id = await deploydb.rollback(
                connection, deployment_id, version, policy, signs=signs
            )
    except DeploymentError as exc:
        raise BadRequest(exc.status, exc.message) from exc
    hub.wake_controller()
    await hub.changes.bump()
    return await _deployment_response(request, new_id, 201)


# ---- the application ---------------------------------------------------------------------


BASE = "/api/v1"
PAGE = (api_inputs.LIMIT, api_inputs.OFFSET)
LONG_POLL = (api_inputs.WAIT, api_inputs.AFTER)


def operations() -> list[inputs.Operation]:
    """Every JSON route with what it reads: the one list the server checks and documents."""
    op, b = inputs.Operation, BASE
    deployment = f"{b}/deployments/{{deployment_id}}"
    return [
        op("GET", "/openapi.json", openapi),
        op("GET", f"{b}/health", health, (api_inputs.WAIT,)),
        op("GET", f"{b}/devices", list_devices, (*api_inputs.FILTERS, *PAGE, *LONG_POLL)),
        op("GET", f"{b}/devices/{{device_id}}", get_device, (api_inputs.DEVICE_ID, *LONG_POLL)),
        op(
            "GET",
            f"{b}/devices/{{device_id}}/history",
            device_history,
            (api_inputs.DEVICE_ID, api_inputs.LIMIT, api_inputs.BEFORE, api_inputs.KIND),
        ),
        op("GET", f"{b}/releases", list_releases, (api_inputs.MODEL,)),
        op(
            "POST",
            f"{b}/releases",
            create_release,
            body=inputs.Body(api_inputs.ENVELOPE, checked=False),
        ),
        op("GET", f"{b}/releases/{{release_id}}", get_release, (api_inputs.RELEASE_ID,)),
        op(
            "GET",
            f"{b}/releases/{{release_id}}/envelope",
            release_envelope,
            (api_inputs.RELEASE_ID,),
        ),
        op("GET", f"{b}/deployments", list_deployments, (api_inputs.STATE, *PAGE)),
        op(
            "POST",
            f"{b}/deployments",
            create_deployment,
            body=inputs.Body(api_inputs.new_deployment),
        ),
        op("GET", deployment, get_deployment, (api_inputs.DEPLOYMENT_ID, *PAGE, *LONG_POLL)),
        op(
            "POST",
            f"{deployment}/rollback",
            rollback_deployment,
            (api_inputs.DEPLOYMENT_ID,),
            inputs.Body(api_inputs.rollback),
        ),
        op(
            "POST",
            f"{deployment}/{{action:pause|resume|abort}}",
            act_on_deployment,
            (api_inputs.DEPLOYMENT_ID, api_inputs.ACTION),
            inputs.Body(api_inputs.ACTION_BODY, required=False),
        ),
    ]


def openapi_document(settings: ServerSettings | None = None) -> dict[str, Any]:
    """``openapi.yaml`` with each operation's inputs from ``operations()``, at the limits of
    ``settings`` (the served document shows the running server's own)."""
    import yaml

    text = resources.files("edgeagent.hub.server").joinpath("openapi.yaml").read_text("utf-8")
    return inputs.document(yaml.safe_load(text), operations(), settings or ServerSettings())


async def openapi(request: web.Request) -> web.Response:
    return web.json_response(openapi_document(context_of(request).settings))


def create_app(hub: HubContext, tokens: Tokens, blobs: BlobStore | None = None) -> web.Application:
    """The hub's app; ``blobs`` is where sample images go (default: what the settings name)."""
    guard = Guard(hub.settings.host, hub.settings.allowed_hosts, hosts_key="--allowed-host")
    app = web.Application(
        middlewares=[errors_middleware, guard.middleware(), auth_middleware(tokens)],
        client_max_size=hub.settings.max_body_bytes,
    )
    app.on_response_prepare.append(security_headers)
    app[CONTEXT] = hub
    app[TOKENS] = tokens
    app.add_routes(dashboard_routes())
    app.add_routes(sample_routes())
    samples_api.install(
        app, hub.settings.samples, blobs or hub.settings.samples.blobs(hub.settings.state_dir)
    )
    app.add_routes([operation.route(hub.settings) for operation in operations()])
    return app
