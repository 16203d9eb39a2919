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

from edgeagent.hub.server import fleetdb
from edgeagent.hub.server.changes import Changes
from edgeagent.hub.server.ingest import Ingest
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


CONTEXT = web.AppKey("hub", HubContext)


class BadRequest(Exception):
    """A 4xx; ``errors_middleware`` answers it as ``{"error": message}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def context_of(request: web.Request) -> HubContext:
    return request.app[CONTEXT]


def query_int(request: web.Request, name: str, default: int, low: int, high: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise BadRequest(400, f"?{name}= must be an integer, got {raw[:32]!r}") from None
    if not low <= value <= high:
        raise BadRequest(400, f"?{name}= must be {low}..{high}, got {value}")
    return value


def query_float(request: web.Request, name: str, high: float) -> float | None:
    raw = request.query.get(name)
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise BadRequest(400, f"?{name}= must be a number, got {raw[:32]!r}") from None
    if not 0 <= value <= high:
        raise BadRequest(400, f"?{name}= must be 0..{high:g}, got {value:g}")
    return value


def query_page(request: web.Request) -> tuple[int, int]:
    settings = context_of(request).settings
    limit = query_int(request, "limit", settings.page_size, 1, settings.max_page_size)
    return limit, query_int(request, "offset", 0, 0, 10**9)


def query_filter(request: web.Request) -> fleetdb.DeviceFilter:
    query = request.query
    where = fleetdb.DeviceFilter(
        group=query.get("group", ""),
        model=query.get("model", ""),
        version=query.get("version", ""),
        profile=query.get("profile", ""),
        availability=query.get("availability", ""),
        governor_state=query.get("governor_state", ""),
    )
    if where.version and not where.model:
        raise BadRequest(400, "?version= needs ?model= (the version of which model)")
    if where.availability not in ("", "online", "offline", "unknown"):
        raise BadRequest(400, "?availability= must be online, offline or unknown")
    return where
