"""Bearer-token check for TCP listeners that are reachable from other machines (SPEC §5).

The Unix socket is protected by its file mode and group, and a loopback-only TCP listener by
never leaving the machine; anything else must present ``Authorization: Bearer <[server] token>``.
A connection is trusted without a token only when both the configured listener address and the
address it actually arrived on are loopback, so a wildcard bind (0.0.0.0) always needs the token.
"""

from __future__ import annotations

import hmac
import socket
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from edgeagent.api.settings import ServerSettings, is_loopback

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def over_tcp(request: web.Request) -> bool:
    """True when the request arrived on a TCP connection (not the Unix socket)."""
    transport = request.transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    return sock is not None and sock.family != socket.AF_UNIX


def needs_token(request: web.Request, settings: ServerSettings) -> bool:
    """True when the request came over TCP on a non-loopback listener or address."""
    if not over_tcp(request):
        return False
    local = request.transport.get_extra_info("sockname") if request.transport else None
    local_host = local[0] if isinstance(local, tuple) and local else ""
    return not (is_loopback(settings.tcp_host) and is_loopback(local_host))


def token_problem(header: str | None, token: str) -> str | None:
    """Why ``header`` does not carry ``Bearer <token>``, or None when it does (constant time)."""
    if not token:
        return (
            "this listener is not on loopback and no [server] token is configured; "
            "requests are refused until one is set"
        )
    scheme, _, presented = (header or "").partition(" ")
    if scheme.lower() != "bearer" or not presented.strip():
        return "missing bearer token: send 'Authorization: Bearer <token>'"
    if not hmac.compare_digest(presented.strip().encode(), token.encode()):
        return "wrong bearer token"
    return None


def auth_middleware(settings: ServerSettings) -> Middleware:
    """An aiohttp middleware enforcing the token where ``needs_token`` says so."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if needs_token(request, settings):
            problem = token_problem(request.headers.get("Authorization"), settings.token)
            if problem is not None:
                return web.json_response(
                    {"error": problem}, status=401, headers={"WWW-Authenticate": "Bearer"}
                )
        return await handler(request)

    return middleware
