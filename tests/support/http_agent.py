"""A real agent HTTP server for tests: registry + app on a Unix socket and a TCP port.

It runs its own event loop in a thread so that synchronous clients (tritonclient, the CLI's
client) and asyncio tests can both talk to it over real sockets, exactly as separate processes
would. Its listeners are the daemon's own (``edgeagent.api.listeners``), and like the daemon's
its TCP port needs a bearer token: ``TOKEN`` (``ADMIN_TOKEN`` for repository load/unload)
unless the test configures others; ``tcp_session`` sends the first, ``triton_client`` the
second, as an operator's repository client would.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import tritonclient.http as triton
from aiohttp import web
from prometheus_client import CollectorRegistry
from tritonclient._plugin import InferenceServerClientPlugin

from edgeagent.api.http.app import create_app
from edgeagent.api.listeners import handler_args, tcp_site, unix_site
from edgeagent.api.settings import ServerSettings
from edgeagent.api.shm.regions import SharedMemoryRegistry
from edgeagent.api.shm.settings import SharedMemorySettings
from edgeagent.engine.busy_counter import LoadCounter
from edgeagent.engine.dataplane import DataPlane
from edgeagent.engine.limits import UNTHROTTLED
from edgeagent.engine.metrics import EngineMetrics
from edgeagent.engine.settings import EngineSettings
from edgeagent.models.package import load_package
from edgeagent.models.session import open_variant
from tests.support.helpers import serving_registry, write_tiny_package

TOKEN = "test-token"
ADMIN_TOKEN = "test-admin-token"


class AgentServer:
    """Serve ``packages`` until ``stop()``; ``socket`` and ``url`` say where."""

    def __init__(self, tmp_path: Path, packages: list[Path], **settings: Any) -> None:
        self.socket = tmp_path / "agent.sock"
        defaults: dict[str, Any] = {
            "unix_socket": self.socket,
            "tcp_port": 0,
            "token": TOKEN,
            "admin_token": ADMIN_TOKEN,
        }
        merged = {**defaults, **settings}
        listener = {f.name for f in dataclasses.fields(ServerSettings)}
        regions = {f.name for f in dataclasses.fields(SharedMemorySettings)}
        self.settings = ServerSettings(**{k: v for k, v in merged.items() if k in listener})
        self.shared_memory = SharedMemoryRegistry(
            SharedMemorySettings(**{k: v for k, v in merged.items() if k in regions})
        )
        self.engine_settings = EngineSettings(
            **{k: v for k, v in merged.items() if k not in listener | regions}
        )
        self.packages = packages
        self.metrics = CollectorRegistry()
        self.engine_metrics = EngineMetrics(self.metrics)
        self.engine_load = LoadCounter()  # what the batchers count, for a governor
        self.status_extra: dict[str, Any] = {"profile": {"name": "test"}}
        self.limits = UNTHROTTLED  # what the governor would ask of the engine; tests change it
        self.url = ""
        self.headers = {"Authorization": f"Bearer {self.settings.token}"}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._executor = ThreadPoolExecutor(2)
        self._runner: web.AppRunner | None = None

    def run(self, factory: Callable[[], Coroutine[Any, Any, Any]], timeout: float = 60) -> Any:
        """Run a coroutine on the server's loop (e.g. a registry call) and return its result."""
        return asyncio.run_coroutine_threadsafe(factory(), self._loop).result(timeout)

    def start(self) -> AgentServer:
        self._thread.start()
        self.run(self._start)
        return self

    def stop(self) -> None:
        self.run(self._stop)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()
        self._executor.shutdown()

    async def _start(self) -> None:
        self.registry = serving_registry(
            lambda package: open_variant(package, threads=1),
            settings=self.engine_settings,
            metrics=self.engine_metrics,
            executor=self._executor,
            limits=lambda: self.limits,
            load=self.engine_load,
        )
        for package in self.packages:
            self.registry.add(package)
        await self.registry.load_all()
        self.app = app = create_app(
            DataPlane(self.registry, self.engine_settings, self.engine_metrics),
            settings=self.settings,
            metrics=self.metrics,
            status=lambda: {**self.status_extra, "models": self.registry.status()},
            shared_memory=self.shared_memory,
        )
        self._runner = web.AppRunner(app, access_log=None, **handler_args(self.settings))
        await self._runner.setup()
        self.unix = unix_site(self._runner, self.socket, self.settings)
        await self.unix.start()
        self.tcp = tcp_site(self._runner, "127.0.0.1", 0, self.settings)
        await self.tcp.start()
        self.url = f"http://127.0.0.1:{self.tcp.sockets[0].getsockname()[1]}"

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        self.shared_memory.close()
        await self.registry.close()


@contextmanager
def tiny_agent(root: Path, **settings: Any) -> Iterator[AgentServer]:
    """An agent serving the tiny test package from ``root``, stopped on exit."""
    server = AgentServer(root, [write_tiny_package(root / "tiny")], **settings).start()
    try:
        yield server
    finally:
        server.stop()


@asynccontextmanager
async def unix_session(server: AgentServer) -> AsyncIterator[aiohttp.ClientSession]:
    """An aiohttp client session over the agent's Unix socket."""
    connector = aiohttp.UnixConnector(path=str(server.socket))
    async with aiohttp.ClientSession("http://agent", connector=connector) as session:
        yield session


def tcp_session(server: AgentServer, **options: Any) -> aiohttp.ClientSession:
    """An aiohttp client session to the agent's TCP listener, sending its token."""
    return aiohttp.ClientSession(server.url, headers=server.headers, **options)


class BearerToken(InferenceServerClientPlugin):
    """tritonclient's way of adding a header to every request: here the agent's token."""

    def __init__(self, token: str) -> None:
        self.token = token

    def __call__(self, request: Any) -> None:
        request.headers["Authorization"] = f"Bearer {self.token}"


def triton_client(server: AgentServer) -> triton.InferenceServerClient:
    """The stock tritonclient.http client for the agent's TCP listener, with the admin token."""
    client = triton.InferenceServerClient(server.url.removeprefix("http://"))
    client.register_plugin(BearerToken(server.settings.admin_token))
    return client


@contextmanager
def direct_run(package_dir: Path) -> Iterator[Callable[[np.ndarray], np.ndarray]]:
    """The tiny model run in-process, without the agent: the reference for served answers."""
    session = open_variant(load_package(package_dir), threads=1)
    try:
        yield lambda batch: session.run({"input": batch})["logits"]
    finally:
        session.close()
