"""Streaming a generation to an HTTP client: SSE (OpenAI) and NDJSON (Ollama) framing, each
chunk written to the socket as soon as the engine produces it.

aiohttp writes a chunked response straight to the transport (no compression is enabled on these
responses, so nothing buffers a chunk), so a token reaches the client at once. When the client
goes away, the next write fails (``ConnectionResetError``) or, where the server cancels the
handler, the task is cancelled; either way the caller's ``async with aclosing(generation)``
closes the generation, and the engine frees its sequence within one decode step.
"""

from __future__ import annotations

import json
import logging
from contextlib import aclosing
from typing import Any, Protocol

from aiohttp import web

from edgeagent.engine.errors import ServingError
from edgeagent.engine.text_requests import Generation

log = logging.getLogger(__name__)

SSE_TYPE = "text/event-stream"
NDJSON_TYPE = "application/x-ndjson"
SSE_DONE = b"data: [DONE]\n\n"


def _json(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def sse_event(value: Any) -> bytes:
    """One server-sent event carrying ``value`` as JSON (``data: {...}`` and a blank line)."""
    return b"data: " + _json(value) + b"\n\n"


def ndjson_line(value: Any) -> bytes:
    """One line of newline-delimited JSON."""
    return _json(value) + b"\n"


async def open_stream(request: web.Request, content_type: str) -> web.StreamResponse:
    """A prepared streaming response; its headers leave at once, so a client sees the stream
    start (and a proxy is told not to buffer it) before the first token."""
    response = web.StreamResponse(
        headers={
            "Content-Type": f"{content_type}; charset=utf-8",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
        }
    )
    await response.prepare(request)
    return response


def client_gone(request: web.Request) -> bool:
    """The client closed its connection (aiohttp drops the transport when it is lost)."""
    return request.transport is None or request.transport.is_closing()


async def collect(request: web.Request, generation: Generation) -> str:
    """The whole text of an answer that is not streamed; given up (and the generation closed
    by the caller) as soon as the client is seen gone, rather than generating for no one."""
    parts = []
    async for chunk in generation:
        if client_gone(request):
            raise ConnectionResetError("the client closed the connection")
        parts.append(chunk.text)
    return "".join(parts)


class Framing(Protocol):
    """How one API writes an answer: whole, or as the frames of a stream."""

    content_type: str  # of the stream

    def whole(self, text: str, generation: Generation) -> dict[str, Any]: ...

    def opening(self) -> bytes: ...  # before the first text (b"": nothing)

    def text(self, text: str) -> bytes: ...

    def closing(self, generation: Generation) -> bytes: ...  # once it ended well

    def error(self, exc: ServingError) -> bytes: ...  # it failed after the stream began


async def answer(
    request: web.Request, generation: Generation, stream: bool, framing: Framing
) -> web.StreamResponse:
    """Send ``generation`` to the client whole or streamed, and close it whatever happens: the
    end, an error, the client gone (a failed write) or the handler cancelled."""
    async with aclosing(generation):
        if not stream:
            try:
                text = await collect(request, generation)
            except ConnectionResetError:  # nobody reads this answer: the generation is closed
                return web.Response(status=499)
            return web.json_response(framing.whole(text, generation))
        response = await open_stream(request, framing.content_type)
        try:
            await response.write(framing.opening())
            try:
                async for chunk in generation:
                    if chunk.text:
                        await response.write(framing.text(chunk.text))
            except ServingError as exc:  # the status line went: an error frame ends it
                await response.write(framing.error(exc))
            else:
                await response.write(framing.closing(generation))
            await response.write_eof()
        except ConnectionResetError:
            log.debug("client left %s mid-stream; its generation is closed", request.path)
        return response
