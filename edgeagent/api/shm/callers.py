"""Who calls, for the shared memory extension: each transport's caller as a ``shm.Caller``.

Regions are bound to their caller and objects opened only for callers who could open them
themselves (``edgeagent.api.shm.regions``), so each transport says what it knows about its caller:

- the HTTP Unix socket knows its peer exactly: the kernel's ``SO_PEERCRED`` (uid, gid) and
  ``SO_PEERGROUPS`` (supplementary groups) of the connection;
- gRPC's library hides the socket, so a gRPC Unix-socket peer is known only by who may connect:
  with ``[grpc] socket_mode`` open to the agent's user alone, that user; otherwise anyone;
- a TCP caller has no uid: it is the bearer token it presented (the auth middleware has
  already checked that the token reaches the route's scope), and may be any local user.
"""

from __future__ import annotations

import errno
import hashlib
import socket
import struct
from typing import Any

from aiohttp import web

from edgeagent.api.auth import presented_token
from edgeagent.api.shm.regions import Caller, agent_user

# Python 3.11 does not name Linux's SO_PEERGROUPS (include/uapi/asm-generic/socket.h: 59).
SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)
_CREDENTIALS = struct.Struct("3i")  # struct ucred: pid, uid, gid
_GROUPS_READ = 256  # what getsockopt can return (1024 bytes); a peer in more groups is
# judged by its primary group alone, which grants less, never more


def peer_caller(sock: Any) -> Caller:
    """The Unix-socket peer of ``sock`` (a socket or asyncio's TransportSocket)."""
    _, uid, gid = _CREDENTIALS.unpack(
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDENTIALS.size)
    )
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, 4 * _GROUPS_READ)
    except OSError as exc:  # ERANGE: more groups than read; fewer groups only grant less
        if exc.errno not in (errno.ERANGE, errno.ENOPROTOOPT):
            raise
        raw = b""
    groups = struct.unpack(f"{len(raw) // 4}I", raw[: len(raw) // 4 * 4])
    return Caller(f"uid {uid}", uid, frozenset({gid, *groups}))


def token_caller(header: str | None) -> Caller:
    """A TCP caller, bound to the token it presented (never written out: a digest names it)."""
    token = presented_token(header)
    owner = "TCP without a token" if token is None else "TCP token " + _digest(token)
    return Caller(owner, None, network=True)


def _digest(token: bytes) -> str:
    return hashlib.sha256(token).hexdigest()[:16]


def http_caller(request: web.Request) -> Caller:
    """The caller of an HTTP request, on either listener."""
    transport = request.transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is not None and sock.family == socket.AF_UNIX:
        return peer_caller(sock)
    return token_caller(request.headers.get("Authorization"))


def grpc_caller(peer: str, metadata: Any, socket_mode: int) -> Caller:
    """The caller of a gRPC call from its ``context.peer()``, ``invocation_metadata()`` and the
    gRPC socket's mode."""
    if peer.startswith("unix:"):
        if socket_mode & 0o077 == 0:  # nobody but the agent's user (and root) can connect
            return agent_user()
        return Caller("the gRPC socket", None)
    header = dict(metadata or ()).get("authorization")
    return token_caller(header if isinstance(header, str) else None)
