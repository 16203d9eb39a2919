"""The API's listeners: a connection cap per listener, the head time-out, quiet accept errors.

aiohttp accepts every connection it is offered and waits on each for ever by default, so a few
hundred slow clients exhaust the process's file descriptors and take every listener down. Here:

- each listener (the Unix socket, the TCP port) counts its own connections; one over
  ``[server] max_connections`` is answered ``503`` and closed at once, so a flood on TCP never
  takes the descriptors the Unix socket needs;
- a connection must deliver a complete request head within ``[server] header_timeout_s`` of
  opening or of its previous answer, else it is closed (aiohttp's keep-alive timer, which
  closes a connection that is still waiting for a head when it fires);
- bodies are paced by ``edgeagent.api.body``;
- a client that stops reading its answers (the agent's send buffer stays full for
  ``[server] send_timeout_s``) is disconnected, so it cannot pin a handler and a slot for ever;
- errors the event loop reports (``accept()`` failing with EMFILE) are logged at most once per
  ``LOG_EVERY_S`` per kind, with a count of those suppressed.

``GuardedSite`` is an aiohttp site, so ``AppRunner.cleanup()`` stops it like any other.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from edgeagent.api.settings import ServerSettings

log = logging.getLogger(__name__)

LOG_EVERY_S = 10.0
_BUSY = json.dumps({"error": "too many connections to this listener; retry shortly"}).encode()
REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Retry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(_BUSY), _BUSY)
)


def handler_args(settings: ServerSettings) -> dict[str, Any]:
    """What ``web.AppRunner(..., **handler_args(settings))`` needs for the head time-out."""
    return {"keepalive_timeout": settings.header_timeout_s}


class ConnectionCap:
    """How many connections one listener holds, and how many it turned away."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open = 0
        self.refused = 0


class _Guard(asyncio.Protocol):
    """Stands between the transport and aiohttp's per-connection protocol, admitting or not,
    and watching how long the client leaves the agent's answers unread."""

    def __init__(
        self, make: Callable[[], asyncio.Protocol], cap: ConnectionCap, send_timeout_s: float
    ) -> None:
        self._make = make
        self._cap = cap
        self._send_timeout_s = send_timeout_s
        self._inner: asyncio.Protocol | None = None
        self._transport: asyncio.BaseTransport | None = None
        self._stalled: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._cap.open >= self._cap.limit:
            self._cap.refused += 1
            assert isinstance(transport, asyncio.WriteTransport)
            transport.write(REFUSAL)
            transport.close()
            return
        self._cap.open += 1
        self._transport = transport
        self._inner = self._make()
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()
            loop = asyncio.get_running_loop()
            self._stalled = loop.call_later(self._send_timeout_s, self._drop_stalled)

    def resume_writing(self) -> None:
        self._cancel_stall()
        if self._inner is not None:
            self._inner.resume_writing()

    def _drop_stalled(self) -> None:
        """The client has read nothing for ``send_timeout_s``: abort (a close would wait to
        flush the very buffer it does not read)."""
        self._stalled = None
        if isinstance(self._transport, asyncio.WriteTransport):
            self._transport.abort()

    def _cancel_stall(self) -> None:
        if self._stalled is not None:
            self._stalled.cancel()
            self._stalled = None

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_stall()
        self._transport = None
        if self._inner is not None:
            self._cap.open -= 1
            self._inner.connection_lost(exc)
            self._inner = None


Opener = Callable[[Callable[[], asyncio.Protocol]], Awaitable[asyncio.AbstractServer]]


class GuardedSite(web.BaseSite):
    """An aiohttp site whose connections pass through a ``ConnectionCap``."""

    def __init__(
        self, runner: web.BaseRunner, label: str, opener: Opener, settings: ServerSettings
    ) -> None:
        super().__init__(runner)
        self._label = label
        self._opener = opener
        self._send_timeout_s = settings.send_timeout_s
        self.cap = ConnectionCap(settings.max_connections)

    @property
    def name(self) -> str:
        return self._label

    @property
    def sockets(self) -> list[Any]:
        return list(getattr(self._server, "sockets", None) or [])

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        self._server = await self._opener(lambda: _Guard(server, self.cap, self._send_timeout_s))


def unix_site(runner: web.BaseRunner, path: Path, settings: ServerSettings) -> GuardedSite:
    """The Unix socket listener at ``path`` (the caller claims the path and sets its mode)."""

    async def opener(factory: Callable[[], asyncio.Protocol]) -> asyncio.AbstractServer:
        return await asyncio.get_running_loop().create_unix_server(factory, str(path))

    return GuardedSite(runner, f"unix:{path}", opener, settings)


def tcp_site(runner: web.BaseRunner, host: str, port: int, settings: ServerSettings) -> GuardedSite:
    """The TCP listener on ``host:port`` (port 0: any free port, see ``GuardedSite.sockets``)."""

    async def opener(factory: Callable[[], asyncio.Protocol]) -> asyncio.AbstractServer:
        return await asyncio.get_running_loop().create_server(factory, host, port)

    return GuardedSite(runner, f"http://{host}:{port}", opener, settings)


class QuietLoopErrors:
    """An event-loop exception handler that logs each kind of error at most once a period.

    Under a connection flood asyncio reports every failed ``accept()``; logging each with its
    traceback filled hundreds of megabytes in seconds. The kind is the loop's message text.
    """

    def __init__(self, every_s: float = LOG_EVERY_S, clock: Callable[[], float] = time.monotonic):
        self._every_s = every_s
        self._clock = clock
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        kind = str(context.get("message", "unknown event loop error"))
        now = self._clock()
        last = self._last.get(kind)
        if last is not None and now - last < self._every_s:
            self._suppressed[kind] = self._suppressed.get(kind, 0) + 1
            return
        self._last[kind] = now
        suppressed = self._suppressed.pop(kind, 0)
        exc = context.get("exception")
        detail = f": {type(exc).__name__}: {exc}" if exc is not None else ""
        more = f" ({suppressed} more like it in the last {self._every_s:g} s)" if suppressed else ""
        log.error("event loop: %s%s%s", kind, detail, more, exc_info=exc)
