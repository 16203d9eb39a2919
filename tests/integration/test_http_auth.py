"""Who may call what (SPEC §5): a token on every TCP listener, loopback included, an admin
token for repository load/unload, and nothing on the Unix socket (its file mode decides)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import aiohttp
import pytest

from tests.support.http_agent import AgentServer, tiny_agent, unix_session

TOKEN = "s3cret-token"
ADMIN = "adm1n-token"
UNLOAD = "/v2/repository/models/tiny/unload"
LOAD = "/v2/repository/models/tiny/load"


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentServer]:
    """A loopback listener (the default) with both scopes configured."""
    with tiny_agent(tmp_path_factory.mktemp("auth"), token=TOKEN, admin_token=ADMIN) as server:
        yield server


async def _status(url: str, method: str, path: str, token: str | None) -> tuple[int, dict]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        aiohttp.ClientSession(url) as http,
        http.request(method, path, headers=headers) as response,
    ):
        body = await response.json() if response.content_type == "application/json" else {}
        if response.status == 401:
            assert response.headers["WWW-Authenticate"] == "Bearer"
        return response.status, body


@pytest.mark.parametrize(
    ("authorization", "status", "fragment"),
    [
        (None, 401, "missing bearer token"),
        ("Basic dXNlcjpwYXNz", 401, "missing bearer token"),
        ("Bearer wrong", 401, "wrong bearer token"),
        (f"Bearer {TOKEN}", 200, None),
        (f"bearer {TOKEN}", 200, None),
        (f"Bearer {ADMIN}", 200, None),  # the admin token reaches the user scope too
    ],
)
async def test_loopback_tcp_needs_the_token(
    agent: AgentServer, authorization: str | None, status: int, fragment: str | None
) -> None:
    headers = {"Authorization": authorization} if authorization else {}
    async with (
        aiohttp.ClientSession(agent.url) as http,
        http.get("/v1/status", headers=headers) as response,
    ):
        assert response.status == status
        if fragment:
            assert response.headers["WWW-Authenticate"] == "Bearer"
            assert fragment in (await response.json())["error"]


async def test_unload_and_load_need_the_admin_token(agent: AgentServer) -> None:
    status, body = await _status(agent.url, "POST", UNLOAD, TOKEN)
    assert status == 403 and "admin token" in body["error"]
    assert agent.registry.status()["tiny"]["state"] == "READY"  # nothing changed
    assert (await _status(agent.url, "POST", UNLOAD, None))[0] == 401
    assert (await _status(agent.url, "POST", UNLOAD, ADMIN))[0] == 200
    assert (await _status(agent.url, "POST", LOAD, TOKEN))[0] == 403
    assert (await _status(agent.url, "POST", LOAD, ADMIN))[0] == 200
    assert agent.registry.status()["tiny"]["state"] == "READY"


async def test_the_unix_socket_needs_no_token_for_anything(agent: AgentServer) -> None:
    async with unix_session(agent) as http:
        async with http.get("/v1/status") as response:
            assert response.status == 200
        async with http.post(UNLOAD) as response:
            assert response.status == 200
        async with http.post(LOAD) as response:
            assert response.status == 200


async def test_refused_requests_are_counted(agent: AgentServer) -> None:
    assert (await _status(agent.url, "GET", "/v1/status", None))[0] == 401
    async with unix_session(agent) as http, http.get("/metrics") as response:
        text = await response.text()
    assert 'edgeagent_http_requests_total{method="GET",route="/v1/status",status="401"}' in text


async def test_a_non_ascii_authorization_header_is_refused_not_a_crash(
    agent: AgentServer,
) -> None:
    host, port = agent.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Authorization: Bearer \xc3\xa9\xff\xfe\r\nConnection: close\r\n\r\n"
    )
    answer = await reader.read()
    writer.close()
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]


def test_no_token_configured_refuses_every_tcp_request(tmp_path) -> None:
    with tiny_agent(tmp_path, token="") as server:
        status, body = asyncio.run(_status(server.url, "GET", "/v2/health/live", "anything"))
        assert status == 401 and "no [server] token is configured" in body["error"]


def test_tcp_auth_none_opens_the_user_scope_only(tmp_path) -> None:
    with tiny_agent(tmp_path, token="", admin_token=ADMIN, tcp_auth="none") as server:
        assert asyncio.run(_status(server.url, "GET", "/v1/status", None))[0] == 200
        assert asyncio.run(_status(server.url, "POST", UNLOAD, None))[0] == 401
        assert server.registry.status()["tiny"]["state"] == "READY"


def test_without_an_admin_token_load_and_unload_are_socket_only(tmp_path) -> None:
    with tiny_agent(tmp_path, token=TOKEN, admin_token="") as server:
        status, body = asyncio.run(_status(server.url, "POST", UNLOAD, TOKEN))
        assert status == 403 and "admin_token, which is not set" in body["error"]
        assert server.registry.status()["tiny"]["state"] == "READY"
