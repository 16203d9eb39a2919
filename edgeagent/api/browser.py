"""Requests a web browser was tricked into sending: DNS rebinding and cross-site forgery.

A page on any site can make the browser of someone on the device send requests to
127.0.0.1:8080. Two things tell such requests apart, and both are checked on TCP listeners (a
browser cannot open the Unix socket, so nothing is checked there):

- **Host**: a rebound name (``evil.example`` resolving to 127.0.0.1) arrives with its own name
  in ``Host``. Only the listener's own names are answered: the bound address, the address the
  connection arrived on, ``localhost``, and ``[server] allowed_hosts`` — else 403.
- **Origin / content type** of a POST: a cross-site page either sends ``Origin`` naming itself
  (refused unless it is this listener, 403), or, in browsers that omit it, can only send the
  "simple" content types ``text/plain``, ``application/x-www-form-urlencoded`` and
  ``multipart/form-data`` without asking first; the API takes none of them (415).
"""

from __future__ import annotations

import ipaddress
import urllib.parse
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware

from edgeagent.api.auth import over_tcp
from edgeagent.api.settings import ServerSettings

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# What a browser may POST cross-site without a CORS preflight (Fetch standard).
SIMPLE_CONTENT_TYPES = frozenset(
    {"text/plain", "application/x-www-form-urlencoded", "multipart/form-data"}
)
WILDCARDS = frozenset({"0.0.0.0", "::", ""})


def split_authority(authority: str) -> tuple[str, int | None] | None:
    """(host, port) of ``name[:port]`` or ``[v6][:port]``, the host lower-cased and canonical;
    None when it is malformed."""
    try:
        parsed = urllib.parse.urlsplit("//" + authority)
        name, port = parsed.hostname, parsed.port
    except ValueError:
        return None
    if not name:
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


def listener_names(request: web.Request, settings: ServerSettings) -> set[str]:
    """Every name this TCP listener answers to (see the module docstring)."""
    names = {"localhost", *(n.lower().rstrip(".") for n in settings.allowed_hosts)}
    if settings.tcp_host not in WILDCARDS:
        names.add(host_name(settings.tcp_host) or settings.tcp_host)
    local = request.transport.get_extra_info("sockname") if request.transport else None
    if isinstance(local, tuple) and local:
        names.add(str(ipaddress.ip_address(local[0].split("%")[0])))
    return names


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


def browser_refusal(request: web.Request, settings: ServerSettings) -> web.Response | None:
    """The 403/415 answer for a foreign Host, a cross-site Origin or a simple-type POST."""
    host = request.headers.get("Host")
    if host is not None:
        name = host_name(host)
        if name is None or name not in listener_names(request, settings):
            return _answer(
                403,
                f"Host {host!r} is not a name of this listener; add it to [server] "
                "allowed_hosts if clients really use it",
            )
    if request.method in ("GET", "HEAD", "OPTIONS"):
        return None
    origin = request.headers.get("Origin")
    if origin is not None and _origin_authority(origin) != _request_authority(request):
        return _answer(403, f"cross-origin request from {origin!r} refused")
    if request.content_type in SIMPLE_CONTENT_TYPES and request.headers.get("Content-Type"):
        return _answer(
            415,
            f"Content-Type {request.content_type} is refused (a web page could send it "
            "cross-site); send application/json, application/octet-stream or the image type",
        )
    return None


def _answer(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def browser_middleware(settings: ServerSettings) -> Middleware:
    """An aiohttp middleware refusing what ``browser_refusal`` describes, on TCP only."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if over_tcp(request):
            refused = browser_refusal(request, settings)
            if refused is not None:
                return refused
        return await handler(request)

    return middleware
