"""api.listeners.Listeners (issue 22 §6): what the daemon used to do itself when it opened its
listeners, now behind one object; each refusal names the setting to change."""

from __future__ import annotations

import dataclasses
import socket
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from edgeagent.api.listeners import ListenerError, Listeners
from edgeagent.api.settings import ServerSettings
from edgeagent.config import parse_config


def _server(**keys: object) -> ServerSettings:
    """``[server]`` with only the listeners named in ``keys`` (none by default)."""
    listeners: dict[str, object] = {"unix_socket": None, "tcp_port": 0, **keys}
    return dataclasses.replace(parse_config("").server, **listeners)


async def _pong(request: web.Request) -> web.Response:
    return web.Response(text="pong")


@pytest.fixture
async def runner() -> AsyncIterator[web.AppRunner]:
    app = web.Application()
    app.router.add_get("/ping", _pong)
    runner = web.AppRunner(app)
    await runner.setup()
    yield runner
    await runner.cleanup()


async def test_the_unix_socket_opens_with_its_mode_counts_and_is_removed(
    tmp_path: Path, runner: web.AppRunner
) -> None:
    directory = tmp_path / "run %s %d"  # printf-like characters stay the path's own
    path = directory / "agent.sock"
    listeners = Listeners()
    await listeners.open_http(runner, _server(unix_socket=path, socket_mode=0o600))
    assert listeners.addresses == [str(path)]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    connector = aiohttp.UnixConnector(path=str(path))
    async with (
        aiohttp.ClientSession(connector=connector) as client,
        client.get("http://agent/ping") as answer,
    ):
        assert await answer.text() == "pong"
        assert listeners.status()[f"unix:{path}"]["open"] == 1
    await listeners.stop_grpc(1.0)  # no gRPC listener: nothing to stop
    await runner.cleanup()
    listeners.remove_socket()
    assert not path.exists()


async def test_a_port_in_use_names_the_settings_that_place_it(runner: web.AppRunner) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        listeners = Listeners()
        expected = rf"cannot listen on 127\.0\.0\.1:{port}: .+ \(\[server\] tcp_host / tcp_port"
        with pytest.raises(ListenerError, match=expected):
            await listeners.open_http(runner, _server(tcp_port=port))
    assert listeners.addresses == [] and listeners.status() == {}


async def test_a_file_where_the_socket_goes_is_refused(
    tmp_path: Path, runner: web.AppRunner
) -> None:
    squatted = tmp_path / "agent.sock"
    squatted.write_text("not a socket")
    with pytest.raises(
        ListenerError, match="exists and is not a socket; remove it or set --socket"
    ):
        await Listeners().open_http(runner, _server(unix_socket=squatted))
    assert squatted.read_text() == "not a socket"


async def test_no_listener_at_all_is_refused(runner: web.AppRunner) -> None:
    with pytest.raises(ListenerError, match=r"no listener: set \[server\] unix_socket or tcp_port"):
        await Listeners().open_http(runner, _server())
