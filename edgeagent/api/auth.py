"""Who may call what: two scopes of bearer token on TCP, none on the Unix socket (SPEC §5).

The Unix socket's file mode and group are the local access control, so a request that came
through it is trusted with everything. Every TCP listener — loopback included, since any local
user can reach 127.0.0.1 — needs a token:

- the *user* scope (inference, metadata, status, metrics) takes ``[server] token`` or
  ``[server] admin_token``; ``[server] tcp_auth = "none"`` opens this scope without a token;
- the *admin* scope (repository load and unload, which change what the device serves) takes only
  ``[server] admin_token``, whatever ``tcp_auth`` says; with no admin token it is socket-only.

A missing or wrong token is 401 (``WWW-Authenticate: Bearer``); the user token on an admin
route is 403. Tokens are compared in constant time.
"""

from __future__ import annotations

import hmac
import socket
from collections.abc import Awaitable, Callable
from typing import TypeVar

from aiohttp import web
from aiohttp.typedefs import Middleware

from edgeagent.api.settings import ServerSettings

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
H = TypeVar("H", bound=Handler)

_ADMIN = "_edgeagent_admin_scope"


def admin_scope(handler: H) -> H:
    """Mark a route handler as needing the admin token over TCP (see the module docstring)."""
    setattr(handler, _ADMIN, True)
    return handler


def needs_admin(request: web.Request) -> bool:
    return bool(getattr(request.match_info.handler, _ADMIN, False))


def over_tcp(request: web.Request) -> bool:
    """True when the request arrived on a TCP connection (not the Unix socket)."""
    transport = request.transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    return sock is not None and sock.family != socket.AF_UNIX


def presented_token(header: str | None) -> bytes | None:
    """The token of ``Authorization: Bearer <token>``, or None when there is none.

    aiohttp decodes header bytes with surrogate escapes, so non-ASCII bytes come back as they
    were sent and simply match no (ASCII) token.
    """
    scheme, _, value = (header or "").partition(" ")
    value = value.strip()
    if scheme.lower() != "bearer" or not value:
        return None
    return value.encode("utf-8", "surrogateescape")


def _matches(presented: bytes, token: str) -> bool:
    return bool(token) and hmac.compare_digest(presented, token.encode())


def scope_problem(
    presented: bytes | None, admin: bool, settings: ServerSettings
) -> tuple[int, str] | None:
    """(401 or 403, why) when a TCP caller's token does not reach the scope it asks for.

    Transport-neutral: HTTP answers with the status, gRPC maps it to UNAUTHENTICATED or
    PERMISSION_DENIED, so both listeners apply the very same rule.
    """
    if not admin and settings.tcp_auth == "none":
        return None
    wanted = settings.admin_token if admin else settings.token
    if admin and not settings.admin_token:
        return (
            403,
            "repository load/unload over TCP needs [server] admin_token, which is not set; "
            "use the Unix socket",
        )
    if not admin and not settings.token:
        return (
            401,
            "no [server] token is configured, so TCP requests are refused until one is set "
            "(or use the Unix socket)",
        )
    if presented is None:
        return 401, "missing bearer token: send 'Authorization: Bearer <token>'"
    if _matches(presented, wanted) or (not admin and _matches(presented, settings.admin_token)):
        return None
    if admin and _matches(presented, settings.token):
        return 403, "repository load/unload needs the admin token ([server] admin_token)"
    return 401, "wrong bearer token"


def refusal(request: web.Request, settings: ServerSettings) -> web.Response | None:
    """The 401/403 answer for a TCP request whose token does not reach its route's scope."""
    presented = presented_token(request.headers.get("Authorization"))
    problem = scope_problem(presented, needs_admin(request), settings)
    return None if problem is None else _answer(*problem)


def _answer(status: int, message: str) -> web.Response:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return web.json_response({"error": message}, status=status, headers=headers)


def auth_middleware(settings: ServerSettings) -> Middleware:
    """An aiohttp middleware enforcing the scopes above on TCP requests."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if over_tcp(request):
            refused = refusal(request, settings)
            if refused is not None:
                return refused
        return await handler(request)

    return middleware
