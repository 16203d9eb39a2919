"""Reading request bodies within the limits that protect the device."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from edgeagent.api.keys import SETTINGS
from edgeagent.engine.errors import InvalidInput, PayloadTooLarge

READ_CHUNK = 64 * 1024


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
