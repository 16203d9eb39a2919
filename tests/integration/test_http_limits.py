"""Slow and large clients (issue 10 #11): a connection cap per listener, the head time-out, the
body's minimum rate, the decoding budget, and the Unix socket answering through a TCP flood.

Every test uses real sockets and bounded counts; nothing is timed, each waits for the event
(an answer, an end of file) with a generous bound.
"""

from __future__ import annotations

import asyncio
import json
import resource
import socket
from collections.abc import Iterator

import aiohttp
import pytest

from devtools.agent_process import running_daemon
from edgeagent.api.listeners import REFUSAL
from tests.support.http_agent import AgentServer, tiny_agent, unix_session

BOUND_S = 30  # the most any event below may take before the test fails
HEAD = b"GET /v2/health/live HTTP/1.1\r\nHost: 127.0.0.1\r\n"  # never finished


def _address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


async def _open(url: str) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection(*_address(url))


async def _outcome(reader: asyncio.StreamReader) -> str:
    """How the agent ended a connection: refused (the 503, or a reset that overtook it when the
    client had already sent bytes the agent never read) or closed after admitting it."""
    try:
        answer = await reader.read()
    except ConnectionResetError:
        return "refused"
    return {REFUSAL: "refused", b"": "closed"}.get(answer, answer.decode(errors="replace"))


async def _outcomes(flood: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]) -> list[str]:
    outcomes = await asyncio.wait_for(
        asyncio.gather(*(_outcome(reader) for reader, _ in flood)), BOUND_S
    )
    for _, writer in flood:
        writer.close()
    return outcomes


async def _flood(url: str, count: int) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    flood = []
    for _ in range(count):
        reader, writer = await _open(url)
        writer.write(HEAD[:10])
        flood.append((reader, writer))
    return flood


async def _unix_live(agent_socket) -> int:
    connector = aiohttp.UnixConnector(path=str(agent_socket))
    async with (
        aiohttp.ClientSession(connector=connector) as http,
        http.get("http://agent/v2/health/live") as response,
    ):
        return response.status


@pytest.fixture(scope="module")
def capped(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentServer]:
    with tiny_agent(
        tmp_path_factory.mktemp("capped"),
        max_connections=4,
        header_timeout_s=0.5,
        body_timeout_s=0.5,
        body_min_bytes_per_s=1000,
    ) as server:
        yield server


def test_connections_over_the_cap_are_answered_503_while_the_socket_serves(tmp_path) -> None:
    """Its own agent, whose head time-out outlasts the test: on the shared one (0.5 s) a held
    connection could be cut off on a slow run before the fifth arrived, freeing its place."""
    with tiny_agent(tmp_path, max_connections=4, header_timeout_s=BOUND_S * 4) as agent:

        async def scenario() -> tuple[bytes, int]:
            held = [await _open(agent.url) for _ in range(4)]
            for _, writer in held:  # each is admitted (and made to wait for its head)
                writer.write(HEAD)
            reader, writer = await _open(agent.url)
            answer = await asyncio.wait_for(reader.read(), BOUND_S)
            writer.close()
            live = await _unix_live(agent.socket)  # the socket has its own cap
            for _, writer in held:
                writer.close()
            return answer, live

        assert asyncio.run(scenario()) == (REFUSAL, 200)


async def test_a_head_that_never_ends_is_cut_off(capped: AgentServer) -> None:
    reader, writer = await _open(capped.url)
    writer.write(HEAD)
    assert await asyncio.wait_for(reader.read(), BOUND_S) == b""  # closed, not waited on
    writer.close()


async def test_an_idle_connection_is_cut_off(capped: AgentServer) -> None:
    reader, writer = await _open(capped.url)
    assert await asyncio.wait_for(reader.read(), BOUND_S) == b""
    writer.close()


async def test_a_trickled_body_gets_408_and_the_connection_closes(capped: AgentServer) -> None:
    reader, writer = await _open(capped.url)
    writer.write(
        b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Authorization: Bearer " + capped.settings.token.encode() + b"\r\n"
        b'Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{"inputs"'
    )
    answer = await asyncio.wait_for(reader.read(), BOUND_S)  # to the end: the agent closes
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), answer[:200]
    assert "body_min_bytes_per_s" in json.loads(body)["error"]


async def test_slow_clients_on_tcp_leave_the_unix_socket_answering(
    capped: AgentServer,
) -> None:
    """Forty slow clients (ten times the cap): the excess is refused, the socket serves."""
    flood = await _flood(capped.url, 40)
    assert await _unix_live(capped.socket) == 200
    outcomes = await _outcomes(flood)
    assert outcomes.count("refused") >= 36  # at most the cap was admitted, then timed out
    assert set(outcomes) <= {"refused", "closed"}


def test_a_client_that_never_reads_its_answers_is_dropped(tmp_path) -> None:
    """Hundreds of pipelined requests whose answers (megabytes) are never read: once the send
    buffer has stayed full for send_timeout_s the agent drops the connection and its slot."""
    # The head time-out is longer than the bound, so only the send time-out can drop it.
    with tiny_agent(tmp_path, send_timeout_s=0.5, header_timeout_s=BOUND_S * 4) as agent:

        async def scenario() -> None:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.connect(_address(agent.url))
            request = (
                b"GET /openapi.json HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Authorization: Bearer " + agent.settings.token.encode() + b"\r\n\r\n"
            )
            sock.sendall(request * 400)  # ~10 MB of answers, none of them read
            loop = asyncio.get_running_loop()
            deadline = loop.time() + BOUND_S
            while agent.tcp.cap.open and loop.time() < deadline:  # the condition, polled
                await asyncio.sleep(0.05)
            assert agent.tcp.cap.open == 0, "the stalled reader still holds its connection"
            sock.close()

        asyncio.run(scenario())


def test_the_decoding_budget_is_per_listener_and_refuses_with_503(tmp_path) -> None:
    """A TCP client holding the whole budget makes the next TCP request wait, then 503; a
    request on the Unix socket has its own budget and is answered."""
    limit = 64 * 1024
    with tiny_agent(
        tmp_path, max_body_bytes=limit, max_decoding_bytes=limit, request_timeout_s=0.5
    ) as agent:

        async def scenario() -> tuple[bytes, int, int]:
            _, writer = await _open(agent.url)
            writer.write(  # declares a full-size JSON body, sends almost nothing
                b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                b"Authorization: Bearer " + agent.settings.token.encode() + b"\r\n"
                b"Content-Length: %d\r\n\r\n{" % limit
            )
            await writer.drain()
            body = {"inputs": [{"name": "input", "shape": [1, 3, 8, 8], "datatype": "FP32",
                                "data": [0.0] * 192}]}  # fmt: skip
            async with (
                aiohttp.ClientSession(agent.url, headers=agent.headers) as http,
                http.post("/v2/models/tiny/infer", json=body) as response,
            ):
                tcp_status = response.status
                retry = response.headers.get("Retry-After", "")
            async with (
                unix_session(agent) as http,
                http.post("/v2/models/tiny/infer", json=body) as response,
            ):
                unix_status = response.status
            writer.close()
            return retry.encode(), tcp_status, unix_status

        retry, tcp_status, unix_status = asyncio.run(scenario())
    assert (tcp_status, retry, unix_status) == (503, b"1", 200)


async def _unix_status(agent_socket) -> dict:
    connector = aiohttp.UnixConnector(path=str(agent_socket))
    async with (
        aiohttp.ClientSession(connector=connector) as http,
        http.get("http://agent/v1/status") as response,
    ):
        return await response.json()


def _limit_descriptors() -> None:
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))


@pytest.mark.slow
def test_the_daemon_survives_300_slow_connections_with_256_descriptors(tmp_path) -> None:
    """The issue's scenario against the real process: open-file limit 256, 300 slow TCP
    clients. The excess is refused, the socket answers meanwhile, the log stays short."""
    with running_daemon(tmp_path, "header_timeout_s = 2.0\n", _limit_descriptors) as daemon:

        async def scenario() -> tuple[int, list[str]]:
            flood = await _flood(daemon.url, 300)
            live = await _unix_live(daemon.socket)
            return live, await _outcomes(flood)

        live, outcomes = asyncio.run(scenario())
        assert live == 200
        assert outcomes.count("refused") >= 200 and set(outcomes) <= {"refused", "closed"}
        assert asyncio.run(_unix_live(daemon.socket)) == 200 and daemon.alive()
        listeners = asyncio.run(_unix_status(daemon.socket))["listeners"]
        assert listeners[daemon.url]["refused"] >= 200  # what an operator sees of the flood
    log = daemon.log.read_text()
    assert "out of system resource" not in log
    assert len(log.splitlines()) < 20, log[-2000:]
