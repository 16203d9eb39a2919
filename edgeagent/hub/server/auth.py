"""Bearer tokens with two scopes: ``read`` (look) and ``admin`` (also change deployments).

Tokens live in a file the operator writes, one ``SCOPE TOKEN`` pair a line (``#`` comments),
so they never appear on a command line. Without ``--token-file`` the server makes one admin
token on its first start, ``admin.token`` (0600) in its state directory, and says where: any
local user can reach 127.0.0.1, so loopback is no reason to be open (the agent's rule for its
own API). ``--open`` is the operator saying otherwise: no tokens, everyone is admin.

The dashboard sends the token from a cookie set by ``/login`` (HttpOnly, SameSite=Strict).
A cookie travels with every request the browser makes to this host, whichever page asked —
a page on another port of 127.0.0.1 is the same *site* — so a state change authenticated by
the cookie must also carry ``X-CSRF-Token``: an HMAC of the sign-in session keyed by the token,
which the dashboard's pages embed and no other origin can read or compute.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from edgeagent.fleet.samples import DEVICE_PREFIX
from edgeagent.fsutil import SecretFileError, create_file_exclusive, read_secret_file
from edgeagent.httpguard import SAFE_METHODS
from edgeagent.hub.server.settings import ServerSettings

log = logging.getLogger(__name__)

SCOPES = ("read", "admin")
MIN_TOKEN_CHARS = 16
OPEN_PATHS = ("/openapi.json", "/login")  # the API's description and the sign-in page
COOKIE = "edgeagent_hub_token"  # where /login keeps a browser's token (HttpOnly, SameSite)
SESSION_COOKIE = "edgeagent_hub_session"  # a random id per sign-in, what CSRF tokens bind to
CSRF_HEADER = "X-CSRF-Token"
ADMIN_TOKEN_FILE = "admin.token"  # the generated token, in the state directory


class TokenFileError(ValueError):
    pass


@dataclass(frozen=True)
class Tokens:
    """token → scope; ``open`` (``--open``): no tokens, everyone is admin (loopback only)."""

    scopes: dict[str, str]
    open: bool = False

    @classmethod
    def load(cls, path: Path) -> Tokens:
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
        presented = _bearer(header) or cookie
        if not presented:
            return None
        found = None
        for token, scope in self.scopes.items():  # any text: non-ASCII just matches none
            if hmac.compare_digest(token.encode(), presented.encode("utf-8", "surrogatepass")):
                found = scope
        return found


def _bearer(header: str) -> str:
    scheme, _, presented = header.partition(" ")
    return presented.strip() if scheme.lower() == "bearer" else ""


def hub_tokens(settings: ServerSettings) -> Tokens:
    """The tokens the server accepts: ``--open``'s none, ``--token-file``'s, or else the admin
    token generated in the state directory (see the module docstring)."""
    if settings.open:
        return Tokens({}, open=True)
    if settings.token_file is not None:
        return Tokens.load(settings.token_file)
    return Tokens({generated_admin_token(settings.state_dir): "admin"})


def generated_admin_token(state_dir: Path) -> str:
    """The token in ``state_dir/admin.token``, created (0600, atomically) on the first start;
    refused when other users could read it, since then it may already be copied."""
    path = state_dir / ADMIN_TOKEN_FILE
    created = create_file_exclusive(path, f"{secrets.token_urlsafe(32)}\n".encode(), 0o600)
    try:
        token = read_secret_file(path).decode("ascii").strip()
    except (SecretFileError, UnicodeDecodeError) as exc:
        raise TokenFileError(f"{path}: {exc}") from exc
    if len(token) < MIN_TOKEN_CHARS or not token.isprintable() or " " in token:
        raise TokenFileError(
            f"{path}: expected one token of at least {MIN_TOKEN_CHARS} visible characters; "
            "delete the file to have a new one made"
        )
    log.warning(
        "%s the hub's admin token in %s: send it as 'Authorization: Bearer TOKEN', sign in to "
        "the dashboard with it, or pass '--token-file %s' to hub status/rollout --server "
        "(--token-file on the server replaces it; --open drops tokens)",
        "wrote" if created else "using",
        path,
        path,
    )
    return token


def csrf_token(request: web.Request) -> str:
    """The CSRF token of the browser's sign-in session ('' when it has none): only this
    server's pages show it, and computing it needs the HttpOnly token cookie."""
    token = request.cookies.get(COOKIE, "")
    if not token:
        return ""
    session = request.cookies.get(SESSION_COOKIE, "")
    key = token.encode("utf-8", "surrogatepass")
    message = f"edgeagent-hub-csrf:{session}".encode("utf-8", "surrogatepass")
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def sign_in(response: web.StreamResponse, token: str) -> None:
    """Keep ``token`` in the browser, with a new session id for its CSRF tokens."""
    for name, value in ((COOKIE, token), (SESSION_COOKIE, secrets.token_urlsafe(16))):
        response.set_cookie(name, value, httponly=True, samesite="Strict", path="/")


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def needs(scope: str) -> Callable[[Handler], Handler]:
    """Mark a handler as needing ``scope`` (``read`` is the default for every route)."""

    def mark(handler: Handler) -> Handler:
        handler.required_scope = scope  # type: ignore[attr-defined]
        return handler

    return mark


def _csrf_refusal(request: web.Request, tokens: Tokens) -> web.Response | None:
    """403 for a state change that only the cookie authenticates and that lacks the page's
    CSRF token (a script's ``Authorization`` header is not sent by a browser on its own)."""
    if tokens.open or request.method in SAFE_METHODS:
        return None
    if _bearer(request.headers.get("Authorization", "")):
        return None
    presented = request.headers.get(CSRF_HEADER, "").encode("utf-8", "surrogatepass")
    if presented and hmac.compare_digest(presented, csrf_token(request).encode()):
        return None
    return web.json_response(
        {"error": f"missing or stale {CSRF_HEADER}: reload the dashboard page and try again"},
        status=403,
    )


def _scope(tokens: Tokens, request: web.Request) -> str | None:
    header, cookie = request.headers.get("Authorization", ""), request.cookies.get(COOKIE, "")
    return tokens.scope_of(header, cookie)


def may_change(request: web.Request) -> bool:
    """Whether this request's token may change deployments (admin, or ``--open``): a page
    shows its action buttons and forms only then. Each action's route checks the scope
    itself all the same (``needs``), so a hidden button is a courtesy, not the guard."""
    return _scope(request.app[TOKENS], request) == "admin"


def auth_middleware(tokens: Tokens) -> Callable[..., Awaitable[web.StreamResponse]]:
    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in OPEN_PATHS or request.path.startswith(DEVICE_PREFIX):
            return await handler(request)  # device routes check device tokens themselves
        scope = _scope(tokens, request)
        if scope is None and not request.path.startswith("/api/"):
            raise web.HTTPSeeOther("/login")  # a person at the dashboard: sign in first
        if scope is None:
            return web.json_response(
                {"error": "missing or unknown bearer token: send 'Authorization: Bearer TOKEN'"},
                status=401,
                headers={"WWW-Authenticate": "Bearer"},
            )
        refused = _csrf_refusal(request, tokens)
        if refused is not None:
            return refused
        route_handler = getattr(request.match_info, "handler", None)
        required = getattr(route_handler, "required_scope", "read")
        if required == "admin" and scope != "admin":
            return web.json_response({"error": "this needs a token with admin scope"}, status=403)
        return await handler(request)

    return check


# for the sign-in page, which checks what it is given, and for pages that show actions
TOKENS = web.AppKey("hub_tokens", Tokens)
