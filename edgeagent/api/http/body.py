"""Reading request bodies within the limits that protect the device.

Three limits apply to every body: its size (``[server] max_body_bytes``, 413), its pace (after
``body_timeout_s`` it must keep arriving at ``body_min_bytes_per_s``, else 408 and the connection
is closed: a client trickling a body cannot hold a connection and its buffer for ever), and the
listener's decoding budget (``edgeagent.engine.budget``), reserved before the first byte is read.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from edgeagent.api.auth import over_tcp
from edgeagent.api.http.app_keys import BUDGETS, DATAPLANE, SETTINGS
from edgeagent.api.v2 import parse_json_object
from edgeagent.engine.errors import InvalidInput, PayloadTooLarge, ServingError

# Memory per byte of JSON while it is parsed into lists and then arrays (3.7× measured).
JSON_COST = 4


class BodyTooSlow(ServingError):
    """The body did not arrive at the minimum rate; the connection is closed after the answer."""

    status = 408


def _none(declared: int) -> int:
    return 0


def _all(declared: int) -> int:
    return declared


def declared_size(request: web.Request, limit: int) -> int:
    """What the body may grow to: its Content-Length, or the limit when chunked or compressed."""
    if request.content_length is not None and not request.headers.get("Content-Encoding"):
        return min(request.content_length, limit)
    return limit if request.body_exists else 0


@asynccontextmanager
async def received_body(
    request: web.Request, json_bytes: Callable[[int], int] = _none
) -> AsyncIterator[bytes]:
    """The body, read within the budget that stays reserved until the block ends.

    ``json_bytes`` says how much of a body of the declared size is JSON (costed ``JSON_COST``×).
    """
    settings = request.app[SETTINGS]
    declared = declared_size(request, settings.max_body_bytes)
    cost = declared + (JSON_COST - 1) * json_bytes(declared)
    budget = request.app[BUDGETS]["tcp" if over_tcp(request) else "unix"]
    async with budget.hold(cost, request.app[DATAPLANE].settings.request_timeout_s):
        yield await read_body(request)


async def read_body(request: web.Request) -> bytes:
    """The (decompressed) body, refused with 413 as soon as it passes ``max_body_bytes``.

    aiohttp decompresses gzip/deflate bodies while streaming, so counting what arrives bounds
    the decompressed size too: a small compressed bomb is stopped at the limit.
    """
    settings = request.app[SETTINGS]
    limit = settings.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise PayloadTooLarge(
            f"request body of {request.content_length} bytes exceeds the limit of {limit} "
            f"bytes ([server] max_body_bytes)"
        )
    loop = asyncio.get_running_loop()
    started = loop.time()
    slow = BodyTooSlow(
        f"request body arrived slower than {settings.body_min_bytes_per_s} bytes/s "
        "([server] body_min_bytes_per_s, body_timeout_s)"
    )
    # One timer moved on as bytes arrive, not asyncio.wait_for per chunk, which wraps every
    # read in a task of its own (a 600 kB tensor arrives in ~10 chunks). When it fires, the
    # pending read fails with ``slow``.
    deadline = loop.call_at(started + settings.body_timeout_s, request.content.set_exception, slow)
    parts: list[bytes] = []
    size = 0
    try:
        while chunk := await request.content.readany():
            size += len(chunk)
            if size > limit:
                raise PayloadTooLarge(
                    f"request body exceeds the limit of {limit} bytes ([server] max_body_bytes)"
                )
            parts.append(chunk)
            # Behind schedule once fewer bytes came than the minimum rate allows since the grace.
            deadline.cancel()
            due = started + settings.body_timeout_s + size / settings.body_min_bytes_per_s
            deadline = loop.call_at(due, request.content.set_exception, slow)
    except (web.RequestPayloadError, HttpProcessingError) as exc:  # e.g. a corrupt gzip body
        reason = getattr(exc.__cause__, "message", None) or str(exc)
        raise InvalidInput(f"request body could not be read: {reason}") from None
    finally:
        deadline.cancel()
    return b"".join(parts)


async def read_json_object(request: web.Request) -> dict[str, Any]:
    """An optional JSON object body: empty means ``{}`` (tritonclient sends none at times).

    The budget is released once it is parsed: a model load that follows must not hold it.
    """
    async with received_body(request, _all) as body:
        return parse_json_object(body) if body.strip() else {}
