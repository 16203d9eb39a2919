"""The shared listener guard (``edgeagent.httpguard``) on a real loopback aiohttp server: what a
browser could be made to send is refused before the handler runs (which then counts nothing),
what clients send is answered, and every answer carries the security headers."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from edgeagent.httpguard import SECURITY_HEADERS, Guard, accepts_forms, security_headers

CHANGES = web.AppKey("changes", list)


async def _change(request: web.Request) -> web.Response:
    request.app[CHANGES].append(request.path)
    return web.json_response({"changed": True})


@accepts_forms
async def _form(request: web.Request) -> web.Response:
    return await _change(request)


async def _broken(request: web.Request) -> web.Response:
    raise RuntimeError("a handler bug")


async def _away(request: web.Request) -> web.Response:
    raise web.HTTPSeeOther("/")


def _app() -> web.Application:
    guard = Guard("127.0.0.1", ("jetson.local",), hosts_key="--allowed-host")
    app = web.Application(middlewares=[guard.middleware()])
    app.on_response_prepare.append(security_headers)
    app[CHANGES] = []
    app.add_routes(
        [
            web.get("/", _change),
            web.post("/change", _change),
            web.post("/form", _form),
            web.get("/broken", _broken),
            web.get("/away", _away),
        ]
    )
    return app


@pytest.fixture(name="server")
async def server_fixture() -> AsyncIterator[TestServer]:
    server = TestServer(_app(), host="127.0.0.1")
    await server.start_server()
    try:
        yield server
    finally:
        await server.close()


async def _send(
    server: TestServer, method: str, path: str, headers: dict[str, str], data: bytes = b""
) -> tuple[int, str, dict[str, str]]:
    # skip_auto_headers: a test's own Host and Content-Type are sent exactly as written
    async with (
        aiohttp.ClientSession(skip_auto_headers=("Content-Type",)) as http,
        http.request(method, server.make_url(path), headers=headers, data=data) as response,
    ):
        return response.status, await response.text(), dict(response.headers)


def _origin(server: TestServer) -> str:
    return f"http://127.0.0.1:{server.port}"


async def test_control_a_same_origin_json_post_is_answered(server: TestServer) -> None:
    headers = {"Origin": _origin(server), "Content-Type": "application/json"}
    status, _, _ = await _send(server, "POST", "/change", headers, b"{}")
    assert status == 200 and server.app[CHANGES] == ["/change"]


@pytest.mark.parametrize(
    "host",
    [
        "rebind.example",
        "rebind.example:8080",
        "127.0.0.1.rebind.example",
        "user@127.0.0.1",
        "127.0.0.1/path",
        "[::1",
        "localhost:port",
        "127.0.0.1:99999",
        "x" * 5000,
        "",
    ],
)
async def test_a_foreign_or_malformed_host_is_refused(server: TestServer, host: str) -> None:
    status, text, _ = await _send(server, "GET", "/", {"Host": host})
    assert status == 403 and "--allowed-host" in text
    assert server.app[CHANGES] == []


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "localhost:1234", "LOCALHOST", "[::1]:9", "jetson.local."]
)
async def test_the_listeners_own_names_are_answered(server: TestServer, host: str) -> None:
    assert (await _send(server, "GET", "/", {"Host": host}))[0] == 200


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "https://rebind.example"},
        {"Origin": "null"},  # a sandboxed frame of any site
        {"Origin": "http://127.0.0.1:1"},  # the same site, another port: another origin
        {"Origin": "http://localhost:{port}"},  # another name: another origin
        {"Origin": "http://127.0.0.1:{port}/"},  # no browser sends a path
        {"Origin": "http://[::1"},
        {"Origin": "file://"},
        {"Sec-Fetch-Site": "same-site"},  # the browser's own word, no Origin needed
        {"Sec-Fetch-Site": "cross-site", "Origin": "null"},
        {"Sec-Fetch-Site": "cross-site", "Origin": "http://127.0.0.1:{port}"},
    ],
)
async def test_a_state_change_from_another_origin_is_refused(
    server: TestServer, headers: dict[str, str]
) -> None:
    sent = {k: v.format(port=server.port) for k, v in headers.items()}
    status, text, _ = await _send(server, "POST", "/change", sent, b"{}")
    assert status == 403, text
    assert server.app[CHANGES] == []


@pytest.mark.parametrize(
    "headers",
    [
        {},  # curl, the SDKs: no Origin at all
        {"Origin": "null", "Sec-Fetch-Site": "same-origin"},  # our page's form under no-referrer
        {"Sec-Fetch-Site": "none"},  # typed by the user
    ],
)
async def test_clients_and_the_listeners_own_pages_may_change(
    server: TestServer, headers: dict[str, str]
) -> None:
    status, _, _ = await _send(server, "POST", "/change", headers, b"")
    assert status == 200 and server.app[CHANGES] == ["/change"]


async def test_a_read_from_another_origin_is_answered(server: TestServer) -> None:
    """Only state changes are checked: the answer is the browser's to withhold (no CORS)."""
    assert (await _send(server, "GET", "/", {"Origin": "https://rebind.example"}))[0] == 200


@pytest.mark.parametrize(
    "content_type",
    [
        "text/plain",
        "TEXT/PLAIN; charset=utf-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
    ],
)
async def test_browser_sendable_bodies_only_where_a_route_declares_them(
    server: TestServer, content_type: str
) -> None:
    headers = {"Content-Type": content_type}
    status, text, _ = await _send(server, "POST", "/change", headers, b"token=x")
    assert status == 415 and "cross-site" in text
    assert server.app[CHANGES] == []
    assert (await _send(server, "POST", "/form", headers, b"token=x"))[0] == 200


@pytest.mark.parametrize(
    ("method", "path", "headers", "status"),
    [
        ("GET", "/", {}, 200),
        ("GET", "/", {"Host": "rebind.example"}, 403),
        ("POST", "/change", {"Content-Type": "text/plain"}, 415),
        ("GET", "/missing", {}, 404),
        ("PUT", "/change", {}, 405),
        ("GET", "/broken", {}, 500),
        ("GET", "/away", {}, 303),
    ],
)
async def test_every_answer_carries_the_security_headers(
    server: TestServer, method: str, path: str, headers: dict[str, str], status: int
) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.request(
            method, server.make_url(path), headers=headers, allow_redirects=False
        ) as response,
    ):
        assert response.status == status
        for name, value in SECURITY_HEADERS.items():
            assert response.headers[name] == value
    assert "frame-ancestors 'none'" in SECURITY_HEADERS["Content-Security-Policy"]
