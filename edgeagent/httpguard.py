"""One guard for every HTTP listener the project has (the agent's API and the hub server).

A web page on any site can make the browser of someone on the machine send requests to a
listener on 127.0.0.1 or the LAN, from that browser's network position and with its cookies.
Each check here refuses one way such a request gets in, before any handler runs:

- **Host** (DNS rebinding): a name the attacker controls, re-pointed at 127.0.0.1, arrives with
  that name in ``Host``. Only the listener's own names are answered — the loopback names, the
  bound address, the address the connection arrived on and the names the operator configured —
  else 403.
- **Origin** of a state-changing request (every method but GET, HEAD and OPTIONS): a browser
  names the page's origin; anything but this listener's own origin is refused (403), another
  port of the same host included — the same *site*, so a SameSite cookie still travels, but a
  foreign origin. No ``Origin`` means a client that is not a browser (curl, SDKs) and passes.
  ``Origin: null`` (sandboxed frames; also a page's own form posts under
  ``Referrer-Policy: no-referrer``, measured in Chromium 156) passes only with
  ``Sec-Fetch-Site: same-origin``, a header no page can set; a ``Sec-Fetch-Site`` naming another
  site or origin is refused whatever ``Origin`` says.
- **Content type**: without a CORS preflight a browser may send only ``text/plain``, form and
  multipart bodies cross-site, so no route takes them (415) unless it declares it needs them
  (``accepts_forms``) — and such a route must check a token carried in the request, which a
  cross-site page cannot know.
- **Security headers** on every answer (``security_headers``): a Content-Security-Policy that
  allows nothing, ``frame-ancestors 'none'`` included (an HTML page widens it for its own
  script and style by nonce, ``page_policy``), ``X-Frame-Options: DENY``,
  ``X-Content-Type-Options: nosniff``, ``Referrer-Policy: no-referrer``.
"""

from __future__ import annotations

import ipaddress
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from aiohttp import web
from aiohttp.typedefs import Middleware

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
H = TypeVar("H", bound=Handler)

SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# What a browser may POST cross-site without a CORS preflight (Fetch standard).
SIMPLE_CONTENT_TYPES = frozenset(
    {"text/plain", "application/x-www-form-urlencoded", "multipart/form-data"}
)
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARDS = frozenset({"0.0.0.0", "::", ""})
FOREIGN_FETCH_SITES = frozenset({"cross-site", "same-site"})

API_POLICY = "default-src 'none'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
SECURITY_HEADERS = {
    "Content-Security-Policy": API_POLICY,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def page_policy(nonce: str) -> str:
    """The CSP of a server-rendered page whose one ``<script>`` and ``<style>`` carry
    ``nonce``: no other script, style, frame, plug-in or foreign connection runs, and no
    other site may frame it."""
    return (
        f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    )


async def security_headers(request: web.Request, response: web.StreamResponse) -> None:
    """An ``on_response_prepare`` hook: every answer (refusals, errors, redirects too) gets
    ``SECURITY_HEADERS``; a header the handler set itself (a page's CSP) is kept."""
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)


_FORMS = "_edgeagent_accepts_forms"


def accepts_forms(handler: H) -> H:
    """Declare that a route needs a browser-sendable body (a sign-in form, DeepStack's
    multipart upload); the route itself must then require a token carried in the request."""
    setattr(handler, _FORMS, True)
    return handler


def declares_forms(request: web.Request) -> bool:
    return bool(getattr(request.match_info.handler, _FORMS, False))


def split_authority(authority: str) -> tuple[str, int | None] | None:
    """(host, port) of ``name[:port]`` or ``[v6][:port]``, the host lower-cased and canonical;
    None when it is malformed (user info, a path, control characters: nothing a browser sends)."""
    if "@" in authority or not authority.isprintable():
        return None
    try:
        parsed = urllib.parse.urlsplit("//" + authority)
        name, port = parsed.hostname, parsed.port
    except ValueError:
        return None
    if not name or parsed.netloc != authority:
        return None
    name = name.rstrip(".")
    try:
        return str(ipaddress.ip_address(name)), port
    except ValueError:
        return name, port


def host_name(authority: str) -> str | None:
    """The host part of ``authority`` (see ``split_authority``)."""
    split = split_authority(authority)
    return None if split is None else split[0]


def _origin_authority(origin: str) -> tuple[str, int] | None:
    """(host, port) of an Origin header value, default ports filled in; None if opaque."""
    scheme, _, rest = origin.partition("://")
    split = split_authority(rest) if scheme in ("http", "https") and "/" not in rest else None
    if split is None:
        return None
    return split[0], split[1] or (443 if scheme == "https" else 80)


def _request_authority(request: web.Request) -> tuple[str, int] | None:
    split = split_authority(request.headers.get("Host", ""))
    return None if split is None else (split[0], split[1] or 80)


def _own_origin(request: web.Request, origin: str, fetch_site: str) -> bool:
    """Whether ``origin`` is this listener's own (``null`` only when the browser vouches)."""
    if origin == "null":
        return fetch_site == "same-origin"
    return _origin_authority(origin) == _request_authority(request)


def _always(request: web.Request) -> bool:
    return True


@dataclass(frozen=True)
class Guard:
    """The checks of the module docstring for one listener.

    ``listen_host`` is the address it binds; ``allowed_hosts`` the extra names clients use
    (a LAN name, a reverse proxy's), configured under the key named by ``hosts_key``, which the
    refusal names. ``applies`` says which requests are checked (the agent's Unix socket cannot
    be reached by a browser); ``form_route`` which routes may take the simple content types.
    """

    listen_host: str
    allowed_hosts: tuple[str, ...]
    hosts_key: str
    applies: Callable[[web.Request], bool] = _always
    form_route: Callable[[web.Request], bool] = declares_forms
    # The JSON body of a refusal (status, message → body): a route family whose clients parse
    # their own error shape (DeepStack's ``success``) gets it here too. None: {"error": …}.
    body: Callable[[web.Request, int, str], dict[str, Any]] | None = None

    def names(self, request: web.Request) -> set[str]:
        """Every name this listener answers to on the connection ``request`` came by."""
        names = {*LOOPBACK_NAMES, *(n.lower().rstrip(".") for n in self.allowed_hosts)}
        if self.listen_host not in WILDCARDS:
            names.add(host_name(self.listen_host) or self.listen_host)
        local = request.transport.get_extra_info("sockname") if request.transport else None
        if isinstance(local, tuple) and local:
            names.add(str(ipaddress.ip_address(local[0].split("%")[0])))
        return names

    def refusal(self, request: web.Request) -> web.Response | None:
        """The 403/415 answer for what the module docstring refuses, else None."""
        host = request.headers.get("Host")
        if host is not None:
            name = host_name(host)
            if name is None or name not in self.names(request):
                return self._answer(
                    request,
                    403,
                    f"Host {host[:64]!r} is not a name of this listener; add it to "
                    f"{self.hosts_key} if clients really use it",
                )
        if request.method in SAFE_METHODS:
            return None
        fetch_site = request.headers.get("Sec-Fetch-Site", "")
        if fetch_site in FOREIGN_FETCH_SITES:
            return self._answer(
                request, 403, f"a request from another origin ({fetch_site}) is refused"
            )
        origin = request.headers.get("Origin")
        if origin is not None and not _own_origin(request, origin, fetch_site):
            return self._answer(request, 403, f"cross-origin request from {origin[:64]!r} refused")
        if (
            request.headers.get("Content-Type")
            and request.content_type in SIMPLE_CONTENT_TYPES
            and not self.form_route(request)
        ):
            return self._answer(
                request,
                415,
                f"Content-Type {request.content_type} is refused (a web page could send it "
                "cross-site); send application/json or the route's binary type",
            )
        return None

    def _answer(self, request: web.Request, status: int, message: str) -> web.Response:
        body = {"error": message} if self.body is None else self.body(request, status, message)
        return web.json_response(body, status=status)

    def middleware(self) -> Middleware:
        """An aiohttp middleware answering ``refusal`` instead of the handler."""

        @web.middleware
        async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
            if self.applies(request):
                refused = self.refusal(request)
                if refused is not None:
                    return refused
            return await handler(request)

        return guard
