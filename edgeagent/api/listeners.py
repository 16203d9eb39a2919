"""The API's listeners: a connection cap per listener, the head time-out, quiet accept errors.

aiohttp accepts every connection it is offered and waits on each for ever by default, so a few
hundred slow clients exhaust the process's file descriptors and take every listener down. Here:

- each listener (the Unix socket, the TCP port) counts its own connections; one over
  ``[server] max_connections`` is answered ``503`` and closed inside the accept
  (``edgeagent.api.acceptor``), so a flood on TCP never takes the descriptors the Unix socket
  needs, nor more than the cap plus one;
- a connection must deliver a complete request head within ``[server] header_timeout_s`` of
  opening or of its previous answer, else it is closed (aiohttp's keep-alive timer, which
  closes a connection that is still waiting for a head when it fires);
- bodies are paced by ``edgeagent.api.http.body``;
- a client that stops reading its answers (the agent's send buffer stays full for
  ``[server] send_timeout_s``) is disconnected, so it cannot pin a handler and a slot for ever;
- errors the event loop reports are logged at most once per ``LOG_EVERY_S`` per kind, with a
  count of those suppressed (a flood once logged a traceback per failed ``accept()``);
- a TCP listener whose ``tls`` is "auto" serves the ``[tls]`` certificate (``edgeagent.tls``),
  read once and shared with the gRPC listener, so one SIGHUP renews both.

``GuardedSite`` is an aiohttp site, so ``AppRunner.cleanup()`` stops it like any other.

``Listeners`` opens them for the daemon (which only composes): it claims the Unix socket's
path (refusing a directory another user could write), raises the open-file limit to fit every
listener's cap, and starts the optional gRPC listener; a listener that cannot open raises
``ListenerError`` naming the setting to change.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import resource
import socket
import ssl
import stat
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from edgeagent.api.acceptor import Acceptor, ConnectionCap, tcp_sockets, unix_socket
from edgeagent.api.settings import ServerSettings
from edgeagent.tls import ServerTls, TlsError, TlsMode, TlsSettings

if TYPE_CHECKING:  # the grpc extra is optional: imported when [grpc] enabled
    from edgeagent.api.grpc.server import GrpcServer
    from edgeagent.api.grpc.settings import GrpcSettings
    from edgeagent.api.shm.regions import SharedMemoryRegistry
    from edgeagent.engine.dataplane import DataPlane

log = logging.getLogger(__name__)

LOG_EVERY_S = 10.0
LISTEN_BACKLOG = 128  # the kernel's queue of connections not yet accepted (aiohttp's default)
_BUSY = json.dumps({"error": "too many connections to this listener; retry shortly"}).encode()
REFUSAL = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Retry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(_BUSY), _BUSY)
)


def handler_args(settings: ServerSettings) -> dict[str, Any]:
    """What ``web.AppRunner(..., **handler_args(settings))`` needs for the head time-out."""
    return {"keepalive_timeout": settings.header_timeout_s}


class _Guard(asyncio.Protocol):
    """Stands between the transport and aiohttp's per-connection protocol, counting the
    connection out of the cap when it ends (the ``Acceptor`` counted it in) and watching how
    long the client leaves the agent's answers unread."""

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
        self._transport = transport  # counted open by the acceptor, counted out when lost
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


Opener = Callable[[], Awaitable[list[socket.socket]]]


class GuardedSite(web.BaseSite):
    """An aiohttp site whose connections pass through a ``ConnectionCap``."""

    def __init__(
        self,
        runner: web.BaseRunner,
        label: str,
        opener: Opener,
        settings: ServerSettings,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        """``opener`` binds the listening sockets; ``tls`` wraps each admitted connection."""
        super().__init__(runner)
        self._label = label
        self._opener = opener
        self._settings = settings
        self._tls = tls
        self.cap = ConnectionCap(settings.max_connections)

    @property
    def name(self) -> str:
        return self._label

    @property
    def sockets(self) -> list[socket.socket]:
        return self._server.sockets if isinstance(self._server, Acceptor) else []

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        send_timeout_s = self._settings.send_timeout_s
        self._server = Acceptor(
            await self._opener(),
            lambda: _Guard(server, self.cap, send_timeout_s),
            self.cap,
            REFUSAL,
            self._tls,
            self._settings.header_timeout_s,
        )
        await self._server.start_serving()


def unix_site(runner: web.BaseRunner, path: Path, settings: ServerSettings) -> GuardedSite:
    """The Unix socket listener at ``path`` (the caller claims the path and sets its mode)."""

    async def opener() -> list[socket.socket]:
        return [unix_socket(path, LISTEN_BACKLOG)]

    return GuardedSite(runner, f"unix:{path}", opener, settings)


def tcp_site(
    runner: web.BaseRunner,
    host: str,
    port: int,
    settings: ServerSettings,
    tls: ssl.SSLContext | None = None,
) -> GuardedSite:
    """The TCP listener on ``host:port`` (port 0: any free port, see ``GuardedSite.sockets``),
    HTTPS with ``tls``. A TLS connection reaches the guard once its handshake is done, so a
    handshake gets ``header_timeout_s`` (not asyncio's 60 s): a client that opens connections
    and never finishes the handshake holds each no longer than a slow head."""

    async def opener() -> list[socket.socket]:
        return await tcp_sockets(host, port, LISTEN_BACKLOG)

    scheme = "https" if tls is not None else "http"
    return GuardedSite(runner, f"{scheme}://{host}:{port}", opener, settings, tls)


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


class ListenerError(RuntimeError):
    """A listener cannot open; the message says which setting or directory to fix."""


class Listeners:
    """Every listener of one daemon: the HTTP sites, the gRPC server, where clients reach us."""

    def __init__(self, tls: TlsSettings | None = None) -> None:
        """``tls``: the [tls] certificate the TCP listeners whose ``tls`` is "auto" serve."""
        self.addresses: list[str] = []  # for the operator (status, the READY line)
        self.sites: list[GuardedSite] = []
        self.grpc: GrpcServer | None = None
        self._socket_path: Path | None = None
        self._tls_settings = tls or TlsSettings()
        self.tls: ServerTls | None = None  # read once, shared by HTTP and gRPC

    def server_tls(self, mode: TlsMode) -> ServerTls | None:
        """The shared certificate for a TCP listener in ``mode`` (None: plain TCP)."""
        if mode == "off" or not self._tls_settings.enabled:
            return None
        if self.tls is None:
            try:
                self.tls = ServerTls(self._tls_settings)
            except TlsError as exc:
                raise ListenerError(f"{exc} ([tls] cert_file / key_file / client_ca_file)") from exc
        return self.tls

    def reload_tls(self) -> None:
        """SIGHUP: new TLS handshakes on every listener get the files as they are now."""
        if self.tls is not None:
            self.tls.reload()

    async def open_http(self, runner: web.AppRunner, server: ServerSettings) -> None:
        """The Unix socket and the TCP port that ``[server]`` asks for; at least one."""
        asyncio.get_running_loop().set_exception_handler(QuietLoopErrors())
        if server.unix_socket is not None:
            path = Path(server.unix_socket)
            claim_socket_path(path)
            await self._start(unix_site(runner, path, server), "[server] unix_socket, --socket")
            os.chmod(path, server.socket_mode)
            self._socket_path = path
            self.addresses.append(str(path))
        if server.tcp_port:
            tls = self.server_tls(server.tls)
            await self._start(
                tcp_site(
                    runner,
                    server.tcp_host,
                    server.tcp_port,
                    server,
                    tls.context if tls is not None else None,
                ),
                "[server] tcp_host / tcp_port, --port",
            )
            host = f"[{server.tcp_host}]" if ":" in server.tcp_host else server.tcp_host
            scheme = "https" if tls is not None else "http"
            self.addresses.append(f"{scheme}://{host}:{server.tcp_port}")
            if server.tcp_auth == "token" and not server.token:
                log.warning(
                    "TCP listener %s refuses every request: no [server] token is set "
                    "(the Unix socket needs none)",
                    self.addresses[-1],
                )
        if not self.addresses:
            raise ListenerError("no listener: set [server] unix_socket or tcp_port")
        ensure_descriptors(server.max_connections * len(self.addresses))

    async def _start(self, site: GuardedSite, settings: str) -> None:
        """Start ``site``; a failure names the ``settings`` that place it."""
        try:
            await site.start()
        except OSError as exc:
            where = site.name.split("//")[-1].removeprefix("unix:")
            raise ListenerError(f"cannot listen on {where}: {exc.strerror} ({settings})") from exc
        self.sites.append(site)

    async def open_grpc(
        self,
        dataplane: DataPlane,
        settings: GrpcSettings,
        server: ServerSettings,
        regions: SharedMemoryRegistry,
    ) -> None:
        """The KServe v2 gRPC listener when [grpc] enabled (needs the optional [grpc] extra)."""
        if not settings.enabled:
            return
        try:
            from edgeagent.api.grpc.server import GrpcServer
        except ImportError as exc:
            raise ListenerError(
                f"[grpc] enabled needs the grpc extra (pip install 'edgeagent[grpc]'): {exc}"
            ) from exc
        self.grpc = GrpcServer(
            dataplane, settings, server=server, regions=regions, tls=self.server_tls(settings.tls)
        )
        try:
            self.addresses += await self.grpc.start()
        except RuntimeError as exc:  # grpc reports a port it cannot bind as RuntimeError
            raise ListenerError(
                f"cannot listen for gRPC: {exc} ([grpc] host / port / unix_socket)"
            ) from exc

    def status(self) -> dict[str, dict[str, int]]:
        """Each HTTP listener's connections: a flood shows here as "refused"."""
        return {
            site.name: {"open": site.cap.open, "limit": site.cap.limit, "refused": site.cap.refused}
            for site in self.sites
        }

    async def stop_grpc(self, grace_s: float) -> None:
        """Stop the gRPC listener, letting calls in flight finish within ``grace_s``."""
        if self.grpc is not None:
            await self.grpc.stop(grace_s)

    def remove_socket(self) -> None:
        """Remove the Unix socket (last, once nothing is served through it)."""
        if self._socket_path is not None:
            with contextlib.suppress(FileNotFoundError):
                self._socket_path.unlink()


# Descriptors the agent needs besides its connections: models, logs, sensors, MQTT, downloads.
FD_RESERVE = 128


def ensure_descriptors(connections: int) -> None:
    """Raise the open-file soft limit so every listener's full cap fits, or say it cannot."""
    needed = connections + FD_RESERVE
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    if soft != resource.RLIM_INFINITY and soft < needed:
        log.warning(
            "open-file limit %d is below the %d that [server] max_connections needs per "
            "listener plus %d; a connection flood could exhaust it",
            soft,
            needed,
            FD_RESERVE,
        )


def claim_socket_path(path: Path) -> None:
    """Create the socket's directory, and remove a stale socket that nobody listens on.

    The directory must be ours (or root's) and writable by nobody else: whoever can write
    there can replace the socket and answer as the agent (``/tmp/edgeagent-UID`` can be
    created by any user before the agent starts). A directory we own but left open is
    tightened; one someone else owns, or a symbolic link, is refused. A sticky directory such
    as /tmp itself is accepted: nobody else can remove or rename our socket there.
    """
    directory = path.parent
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o750)
    except PermissionError as exc:
        missing = Path(exc.filename or directory)
        raise ListenerError(_unwritable(missing.parent, f"create {missing} in")) from exc
    check_directory(directory)
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ListenerError(_unwritable(directory, "create its socket in"))
    if not path.exists() and not path.is_symlink():
        return
    if not path.is_socket():
        raise ListenerError(f"{path} exists and is not a socket; remove it or set --socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError as exc:
        if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT):
            raise ListenerError(f"cannot check {path}: {exc.strerror}") from exc
        path.unlink()  # a leftover of a daemon that died
    else:
        raise ListenerError(f"{path}: another edgeagent is already listening there")
    finally:
        probe.close()


def _unwritable(directory: Path, what: str) -> str:
    """What to do when the agent may not write the socket's directory (a container whose
    bind-mounted /run/edgeagent the engine created as root 0755, a RuntimeDirectory= lost)."""
    info = directory.stat()
    return (
        f"cannot {what} {directory}: it belongs to uid {info.st_uid} with mode "
        f"{stat.S_IMODE(info.st_mode):04o}, and this agent runs as uid {os.geteuid()}. Give it "
        f"to the agent (chown {os.geteuid()}:{os.getegid()} {directory}; the container image's "
        "entrypoint does this when the container starts as root, so do not pass --user), or "
        "put the socket elsewhere ([server] unix_socket, --socket)"
    )


def check_directory(directory: Path) -> None:
    """Refuse a socket directory another user could write (or a link); tighten our own."""
    info = directory.lstat()
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise ListenerError(f"{directory} is not a plain directory; remove it or set --socket")
    if info.st_uid not in (os.geteuid(), 0):
        raise ListenerError(
            f"{directory} belongs to uid {info.st_uid}, not to this agent (uid {os.geteuid()}): "
            "another user could answer in its place; remove it or set --socket"
        )
    if info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:  # sticky /tmp itself is fine
        if info.st_uid != os.geteuid():
            raise ListenerError(
                f"{directory} is writable by other users; fix its mode or set --socket"
            )
        os.chmod(directory, stat.S_IMODE(info.st_mode) & ~0o022)
