"""What every hub route shares: the context object, the 4xx error, and query parsing.

Kept apart from ``api`` so that the dashboard's pages and the JSON API read the same query
parameters with the same limits and the same messages.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from sqlalchemy.ext.asyncio import AsyncEngine

from edgeagent.hub.server import api_inputs, fleetdb, inputs
from edgeagent.hub.server.changes import Changes
from edgeagent.hub.server.ingest import Ingest
from edgeagent.hub.server.leadership import Leadership
from edgeagent.hub.server.settings import ServerSettings


@dataclass
class HubContext:
    """What the handlers share: the database, the live parts, the settings."""

    engine: AsyncEngine
    settings: ServerSettings
    ingest: Ingest
    changes: Changes
    wake_controller: Callable[[], None]
    trust_file: Path | None = None
    leadership: Leadership | None = None  # whether this replica runs the rollout controller


CONTEXT = web.AppKey("hub", HubContext)


# A 4xx; ``errors_middleware`` answers it as ``{"error": message}`` (the same error as a
# refused input's, so a handler's own refusals and the schemas' read alike).
BadRequest = inputs.InputError


def context_of(request: web.Request) -> HubContext:
    return request.app[CONTEXT]


def query_page(request: web.Request) -> tuple[int, int]:
    """``?limit=&offset=``, checked by the schemas the API documents (``inputs``)."""
    settings = context_of(request).settings
    return api_inputs.LIMIT.read(request, settings), api_inputs.OFFSET.read(request, settings)


def query_filter(request: web.Request) -> fleetdb.DeviceFilter:
    """The fleet table's filters, checked by the schemas the API documents (``inputs``)."""
    settings = context_of(request).settings
    values = {p.name: p.read(request, settings) or "" for p in api_inputs.FILTERS}
    where = fleetdb.DeviceFilter(**values)
    if where.version and not where.model:
        raise BadRequest(400, "?version= needs ?model= (the version of which model)")
    return where
