"""Bearer tokens with two scopes: ``read`` (look) and ``admin`` (also change deployments).

The dashboard sends the same token from a cookie set by ``/login``.

Tokens live in a file the operator writes, one ``SCOPE TOKEN`` pair a line (``#`` comments),
so they never appear on a command line. Without a token file the server may listen on loopback
only, and everyone there is admin — the agent's own rule for its API.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

SCOPES = ("read", "admin")
MIN_TOKEN_CHARS = 16
OPEN_PATHS = ("/openapi.json", "/login")  # the API's description and the sign-in page
COOKIE = "edgeagent_hub_token"  # where /login keeps a browser's token (HttpOnly, SameSite)


class TokenFileError(ValueError):
    pass


@dataclass(frozen=True)
class Tokens:
    """token → scope; ``open`` means no token file: everyone is admin (loopback only)."""

    scopes: dict[str, str]
    open: bool = False

    @classmethod
    def load(cls, path: Path | None) -> Tokens:
        if path is None:
            return cls({}, open=True)
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise TokenFileError(f"{path}: cannot read the token file ({exc.strerror})") from exc
        scopes: dict[str, str] = {}
        for number, line in enumerate(lines, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            parts = line.split()
            if len(parts) != 2 or parts[0] not in SCOPES or len(parts[1]) < MIN_TOKEN_CHARS:
                raise TokenFileError(
                    f"{path}:{number}: expected 'read TOKEN' or 'admin TOKEN' with a token of "
                    f"at least {MIN_TOKEN_CHARS} characters"
                )
            scopes[parts[1]] = parts[0]
        if not scopes:
            raise TokenFileError(f"{path}: no tokens in the file")
        return cls(scopes)

    def scope_of(self, header: str, cookie: str = "") -> str | None:
        """The scope the ``Authorization`` header (or the dashboard's cookie) grants, or
        None; tokens are compared in constant time."""
        if self.open:
            return "admin"
        scheme, _, presented = header.partition(" ")
        if scheme.lower() != "bearer":
            presented = cookie
        if not presented:
            return None
        found = None
        for token, scope in self.scopes.items():
            if hmac.compare_digest(token.encode(), presented.strip().encode()):
                found = scope
        return found


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def needs(scope: str) -> Callable[[Handler], Handler]:
    """Mark a handler as needing ``scope`` (``read`` is the default for every route)."""

    def mark(handler: Handler) -> Handler:
        handler.required_scope = scope  # type: ignore[attr-defined]
        return handler

    return mark


def auth_middleware(tokens: Tokens) -> Callable[..., Awaitable[web.StreamResponse]]:
    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in OPEN_PATHS:
            return await handler(request)
        scope = tokens.scope_of(
            request.headers.get("Authorization", ""), request.cookies.get(COOKIE, "")
        )
        if scope is None and not request.path.startswith("/api/"):
            raise web.HTTPSeeOther("/login")  # a person at the dashboard: sign in first
        if scope is None:
            return web.json_response(
                {"error": "missing or unknown bearer token: send 'Authorization: Bearer TOKEN'"},
                status=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
        route_handler = getattr(request.match_info, "handler", None)
        required = getattr(route_handler, "required_scope", "read")
        if required == "admin" and scope != "admin":
            return web.json_response({"error": "this needs a token with admin scope"}, status=403)
        return await handler(request)

    return check
