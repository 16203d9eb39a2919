"""Requests a browser on the device could be made to send: DNS rebinding and CSRF (issue 10 #10).

Run with ``tcp_auth = "none"``, where these checks are the only thing between a web page and
the API; each refused request must leave the model loaded.
"""

from __future__ import annotations

from collections.abc import Iterator

import aiohttp
import pytest

from tests.support.http_agent import ADMIN_TOKEN, AgentServer, tiny_agent, unix_session

UNLOAD = "/v2/repository/models/tiny/unload"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentServer]:
    with tiny_agent(
        tmp_path_factory.mktemp("browser"), tcp_auth="none", allowed_hosts=["jetson.local"]
    ) as server:
        yield server


async def _send(
    agent: AgentServer, method: str, path: str, headers: dict[str, str], data: bytes = b""
) -> tuple[int, str]:
    async with (
        aiohttp.ClientSession(agent.url) as http,
        http.request(method, path, headers=headers, data=data or None) as response,
    ):
        return response.status, await response.text()


@pytest.mark.parametrize(
    "host", ["evil.example", "evil.example:8080", "127.0.0.1.evil.example", "[::1"]
)
async def test_a_foreign_host_is_refused(agent: AgentServer, host: str) -> None:
    status, text = await _send(agent, "GET", "/v1/status", {"Host": host})
    assert status == 403 and "allowed_hosts" in text


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost:1234", "LOCALHOST", "jetson.local."])
async def test_the_listeners_own_names_are_answered(agent: AgentServer, host: str) -> None:
    assert (await _send(agent, "GET", "/v1/status", {"Host": host}))[0] == 200


async def test_a_rebound_name_cannot_unload(agent: AgentServer) -> None:
    status, _ = await _send(agent, "POST", UNLOAD, {"Host": "evil.example:8080", **ADMIN})
    assert status == 403
    assert agent.registry.status()["tiny"]["state"] == "READY"


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"Origin": "https://evil.example"}, 403),
        ({"Origin": "null"}, 403),
        ({"Content-Type": "text/plain"}, 415),
        ({"Content-Type": "application/x-www-form-urlencoded"}, 415),
        ({"Content-Type": "multipart/form-data; boundary=x"}, 415),
    ],
)
async def test_cross_site_posts_are_refused_and_change_nothing(
    agent: AgentServer, headers: dict[str, str], status: int
) -> None:
    got, text = await _send(agent, "POST", UNLOAD, {**headers, **ADMIN}, b"{}")
    assert got == status, text
    assert agent.registry.status()["tiny"]["state"] == "READY"


async def test_same_origin_and_json_posts_pass(agent: AgentServer) -> None:
    port = agent.url.rsplit(":", 1)[1]
    headers = {"Origin": f"http://127.0.0.1:{port}", "Content-Type": "application/json"}
    assert (await _send(agent, "POST", "/v2/repository/index", headers, b"{}"))[0] == 200


async def test_the_unix_socket_checks_neither(agent: AgentServer) -> None:
    """A browser cannot open a Unix socket; curl's default form type keeps working there."""
    async with (
        unix_session(agent) as http,
        http.post(
            "/v2/repository/index",
            data=b"{}",
            headers={"Host": "anything", "Content-Type": "application/x-www-form-urlencoded"},
        ) as response,
    ):
        assert response.status == 200


async def test_another_port_of_the_same_host_is_another_origin(agent: AgentServer) -> None:
    """The same site (a SameSite cookie would travel) but not this listener (issue 23 #2)."""
    for headers in ({"Origin": "http://127.0.0.1:1"}, {"Sec-Fetch-Site": "same-site"}):
        status, _ = await _send(agent, "POST", UNLOAD, {**headers, **ADMIN})
        assert status == 403
    assert agent.registry.status()["tiny"]["state"] == "READY"


async def test_every_answer_carries_the_security_headers(agent: AgentServer) -> None:
    """Issue 23 #9: no Content-Security-Policy, X-Frame-Options or nosniff."""
    from edgeagent.httpguard import SECURITY_HEADERS

    async with aiohttp.ClientSession(agent.url) as http:
        for path, headers, status in (
            ("/v1/status", {}, 200),
            ("/v1/status", {"Host": "evil.example"}, 403),
            ("/nothing", {}, 404),
        ):
            async with http.get(path, headers=headers) as response:
                assert response.status == status
                assert {k: response.headers.get(k) for k in SECURITY_HEADERS} == SECURITY_HEADERS
    async with unix_session(agent) as http, http.get("/v1/status") as response:
        assert response.headers["X-Frame-Options"] == "DENY"
