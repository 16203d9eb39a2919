"""Accepting a listener's connections with a cap that holds under a flood.

asyncio's own accept loop takes up to a hundred connections per turn of the loop and gives
each a transport before any protocol sees it, so a connection over the cap could only be
refused once its transport existed, and its descriptor was freed two or three turns later.
Under a flood on a busy board those refusals in flight piled up past the open-file limit (CI,
256 descriptors, 100 held: ``accept()`` failed with EMFILE while the cap was doing its job).

Here the listening socket is accepted on directly. A connection over the cap is answered
``503`` and closed inside the accept, so the process holds at most its cap plus the one it is
refusing (twice the cap under uvloop, which duplicates each socket it is given); an admitted
one goes to ``loop.connect_accepted_socket`` (TLS handshake included,
bounded by ``header_timeout_s``). A TLS connection over the cap is closed without an answer:
a plain-text 503 would be noise to a client in its handshake. If ``accept()`` still runs out of
descriptors (models and downloads hold the rest), accepting pauses for ``RETRY_S`` with one
warning instead of a traceback per attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import ssl
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)

ACCEPT_BATCH = 64  # connections taken per wake-up, so a flood cannot starve the loop
RETRY_S = 1.0  # pause after the process ran out of descriptors (asyncio's own delay)
WARN_EVERY_S = 10.0
_OUT_OF_RESOURCES = {errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM}


class ConnectionCap:
    """How many connections one listener holds, and how many it turned away.

    ``open`` counts a connection from its accept (its TLS handshake included: it holds a
    descriptor and a place already) to its end. The acceptor counts it in; the protocol that
    serves it counts it out in ``connection_lost``; the acceptor does when it never got that
    far (a failed handshake). One counter, so no moment counts a connection twice.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open = 0
        self.refused = 0

    @property
    def full(self) -> bool:
        return self.open >= self.limit


async def tcp_sockets(host: str, port: int, backlog: int) -> list[socket.socket]:
    """Listening sockets for every address ``host`` resolves to ("": every interface), bound
    as ``loop.create_server`` binds them: address reuse, IPv6 sockets IPv6-only."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )
    sockets: list[socket.socket] = []
    try:
        for family, kind, proto, _, address in dict.fromkeys(infos):
            sock = socket.socket(family, kind, proto)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(backlog)
            sock.setblocking(False)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def unix_socket(path: Path, backlog: int) -> socket.socket:
    """A listening Unix socket at ``path`` (the caller has claimed the path)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(str(path))
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    sock.setblocking(False)
    return sock


class Acceptor(asyncio.AbstractServer):
    """Serves ``factory``'s protocol on ``sockets``, admitting at most ``cap.limit`` at once.

    The protocol counts its connection out of ``cap.open`` in ``connection_lost`` (the
    listeners' guard does, wrapping aiohttp's): the acceptor sees the accept, never the end.

    An ``asyncio.AbstractServer``, so an aiohttp site stops it like the server it replaces.
    """

    def __init__(
        self,
        sockets: list[socket.socket],
        factory: Callable[[], asyncio.Protocol],
        cap: ConnectionCap,
        refusal: bytes,
        tls: ssl.SSLContext | None = None,
        handshake_timeout_s: float | None = None,
    ) -> None:
        """``refusal``: the bytes a plain connection over the cap is answered with."""
        self.sockets = sockets
        self._factory = factory
        self._cap = cap
        self._refusal = refusal
        self._tls = tls
        self._handshake_timeout_s = handshake_timeout_s if tls is not None else None
        self._loop = asyncio.get_running_loop()
        self._serving = False
        self._connecting: set[asyncio.Task[object]] = set()
        self._resume: asyncio.TimerHandle | None = None
        self._warned_at = -WARN_EVERY_S
        self._closed = self._loop.create_future()

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def is_serving(self) -> bool:
        return self._serving

    async def start_serving(self) -> None:
        self._watch()

    async def serve_forever(self) -> None:
        if not self._serving:
            self._watch()
        await self.wait_closed()

    def close(self) -> None:
        """Stop accepting and close the listening sockets; handshakes under way are dropped."""
        self._unwatch()
        if self._resume is not None:
            self._resume.cancel()
        for sock in self.sockets:
            sock.close()
        for task in self._connecting:
            task.cancel()
        if not self._closed.done():
            self._closed.set_result(None)

    async def wait_closed(self) -> None:
        """Until ``close`` (which is immediate: aiohttp closes the connections themselves)."""
        await asyncio.shield(self._closed)

    def _watch(self) -> None:
        self._resume = None
        self._serving = True
        for sock in self.sockets:
            self._loop.add_reader(sock.fileno(), self._accept, sock)

    def _unwatch(self) -> None:
        if self._serving:
            for sock in self.sockets:
                self._loop.remove_reader(sock.fileno())
        self._serving = False

    def _accept(self, listening: socket.socket) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                conn, _ = listening.accept()
            except (BlockingIOError, InterruptedError, ConnectionAbortedError):
                return
            except OSError as exc:
                if exc.errno not in _OUT_OF_RESOURCES:
                    raise  # the loop's exception handler reports it
                self._pause(exc)
                return
            if self._cap.full:
                self._refuse(conn)
            else:
                self._admit(conn)

    def _refuse(self, conn: socket.socket) -> None:
        self._cap.refused += 1
        with contextlib.closing(conn):
            if self._tls is None:
                conn.setblocking(False)
                with contextlib.suppress(OSError):  # the client left already
                    conn.send(self._refusal)

    def _admit(self, conn: socket.socket) -> None:
        conn.setblocking(False)
        self._cap.open += 1
        task = self._loop.create_task(
            self._loop.connect_accepted_socket(
                self._factory,
                conn,
                ssl=self._tls,
                ssl_handshake_timeout=self._handshake_timeout_s,
            )
        )
        self._connecting.add(task)
        task.add_done_callback(self._connected)

    def _connected(self, task: asyncio.Task[object]) -> None:
        """The protocol has the connection (and counts it out when it ends), or the handshake
        failed before the protocol saw it: counted out here. (Cancelled: the acceptor closed.)"""
        self._connecting.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._cap.open -= 1
            log.debug("connection dropped before it was served: %s", task.exception())

    def _pause(self, exc: OSError) -> None:
        self._unwatch()
        self._resume = self._loop.call_later(RETRY_S, self._watch)
        now = time.monotonic()
        if now - self._warned_at >= WARN_EVERY_S:
            self._warned_at = now
            log.warning(
                "cannot accept connections (%s): paused %g s; raise the open-file limit "
                "or lower [server] max_connections",
                exc.strerror,
                RETRY_S,
            )
