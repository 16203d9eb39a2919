"""Bearer token on TCP listeners that are not loopback; the Unix socket never needs one."""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterator

import aiohttp
import pytest

from tests.integration.http_agent import AgentServer, tiny_agent, unix_session

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def exposed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentServer]:
    """Configured for a wildcard listener: every TCP connection needs the token."""
    with tiny_agent(tmp_path_factory.mktemp("auth"), tcp_host="0.0.0.0", token=TOKEN) as server:
        yield server


@pytest.mark.parametrize(
    ("authorization", "status", "fragment"),
    [
        (None, 401, "missing bearer token"),
        ("Basic dXNlcjpwYXNz", 401, "missing bearer token"),
        ("Bearer wrong", 401, "wrong bearer token"),
        (f"Bearer {TOKEN}", 200, None),
        (f"bearer {TOKEN}", 200, None),
    ],
)
async def test_tcp_needs_the_token(
    exposed: AgentServer, authorization: str | None, status: int, fragment: str | None
) -> None:
    headers = {"Authorization": authorization} if authorization else {}
    async with (
        aiohttp.ClientSession(exposed.url) as http,
        http.get("/v2/models/tiny", headers=headers) as response,
    ):
        assert response.status == status
        if fragment:
            assert response.headers["WWW-Authenticate"] == "Bearer"
            assert fragment in (await response.json())["error"]


async def test_unix_socket_needs_no_token(exposed: AgentServer) -> None:
    async with unix_session(exposed) as http, http.get("/v2/models/tiny") as response:
        assert response.status == 200


async def test_refused_requests_are_counted(exposed: AgentServer) -> None:
    async with aiohttp.ClientSession(exposed.url) as http:
        async with http.get("/v1/status") as response:
            assert response.status == 401
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with http.get("/metrics", headers=headers) as response:
            text = await response.text()
    assert 'edgeagent_http_requests_total{method="GET",route="/v1/status",status="401"}' in text


def test_non_loopback_without_a_configured_token_refuses_everyone(tmp_path) -> None:
    """A config that slipped past validation still fails closed."""
    with tiny_agent(tmp_path, tcp_host="0.0.0.0") as server:
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(server.url + "/v2/health/live", timeout=10)
        assert caught.value.code == 401
        assert b"no [server] token is configured" in caught.value.read()


async def test_loopback_listener_needs_no_token(tmp_path) -> None:
    with tiny_agent(tmp_path, token=TOKEN) as server:
        async with (
            aiohttp.ClientSession(server.url) as http,
            http.get("/v2/health/live") as response,
        ):
            assert response.status == 200
