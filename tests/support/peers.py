"""Peers for tests: this board (one simulated device) serving the tiny model beside peers, and
a v2 server that answers well until told to misbehave (slow, misshapen), closes its port, or
speaks TLS."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import numpy as np
from aiohttp import web

from devtools.package import read_model_toml, write_model_toml
from edgeagent.engine.busy_counter import LoadCounter
from edgeagent.engine.limits import UNTHROTTLED
from edgeagent.engine.settings import EngineSettings
from edgeagent.hardware.instances import InstanceGroup
from edgeagent.hardware.peers import PeerSettings
from edgeagent.hardware.service import Accelerators
from edgeagent.hardware.settings import HardwareSettings
from edgeagent.runtimes.remote import RemoteSession
from tests.support.hardware import FIXTURES, write_profile
from tests.support.helpers import serving_registry


def board(tmp_path: Path, peers: list[PeerSettings]) -> Accelerators:
    """This board: one simulated device SIM0, and ``peers``."""
    write_profile(tmp_path / "profiles", "test", ["onnxruntime:SIM0:fp32"])
    settings = HardwareSettings(
        root=FIXTURES / "generic-x86_64", profiles_dir=tmp_path / "profiles", profile="test"
    )
    return Accelerators(settings, tmp_path / "state", peers=peers)


def frames(count: int, seed: int = 5) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((1, 3, 8, 8)).astype(np.float32) for _ in range(count)]


def serving(root: Path, **values: object) -> Path:
    data = read_model_toml(root)
    data.setdefault("serving", {}).update(values)
    write_model_toml(root, data)
    return root


@asynccontextmanager
async def served(
    tmp_path: Path,
    executor,
    root: Path,
    peers: list[PeerSettings],
    limits=UNTHROTTLED,
    load: LoadCounter | None = None,
    settings: EngineSettings | None = None,
) -> AsyncIterator:
    """The tiny model served on this board (SIM0) with ``peers``, batches of one row."""
    registry = serving_registry(
        board(tmp_path, peers).open,
        executor=executor,
        limits=lambda: limits,
        load=load,
        settings=settings,
    )
    registry.add(serving(root, max_batch_size=1))
    await registry.load_all()
    try:
        yield registry.get("tiny")
    finally:
        await registry.close()


def lanes(model) -> tuple[list, list]:
    """(local instances, peer instances) of a served model's group."""
    group = model.session
    assert isinstance(group, InstanceGroup)
    instances = group.scheduler.instances
    remote = [i for i in instances if isinstance(i.session, RemoteSession)]
    return [i for i in instances if i not in remote], remote


class HostilePeer:
    """A v2 server on loopback that answers well (the warm-up) until told to misbehave:
    ``slow`` never answers in time, ``misshapen`` answers a tensor of the wrong shape,
    ``dribbling`` sends its answer a byte every 0.1 s."""

    def __init__(self, reference, tls: ssl.SSLContext | None = None) -> None:
        self.reference = reference
        self.tls = tls
        self.port = 0
        self.mode = "good"
        self.requests = {"good": 0, "slow": 0, "misshapen": 0, "dribbling": 0}
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._release: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    async def _infer(self, request: web.Request) -> web.Response:
        mode = self.mode
        self.requests[mode] += 1
        body = await request.read()
        length = int(request.headers["Inference-Header-Content-Length"])
        x = np.frombuffer(body[length:], np.float32).reshape(1, 3, 8, 8)
        logits = self.reference(x)
        if mode == "slow":
            assert self._release is not None
            await self._release.wait()  # far past the peer's latency budget
        if mode == "misshapen":
            logits = np.concatenate([logits, logits], axis=1)
        output = {"name": "logits", "datatype": "FP32", "shape": list(logits.shape)}
        answer = {"model_name": "tiny", "outputs": [{**output, "data": logits.ravel().tolist()}]}
        if mode == "dribbling":  # a byte at a time, each well within a read's time-out
            body = json.dumps(answer).encode()
            response = web.StreamResponse(headers={"Content-Length": str(len(body))})
            await response.prepare(request)
            assert self._release is not None
            for index in range(len(body)):
                await response.write(body[index : index + 1])
                with contextlib.suppress(asyncio.TimeoutError):  # the pace of the dribble
                    await asyncio.wait_for(self._release.wait(), 0.1)
            return response
        return web.json_response(answer)

    async def _ready(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def _start(self) -> None:
        self._release = asyncio.Event()
        app = web.Application()
        app.router.add_post("/v2/models/{name}/infer", self._infer)
        app.router.add_get("/v2/health/ready", self._ready)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await self._listen()
        scheme = "https" if self.tls is not None else "http"
        self.url = f"{scheme}://127.0.0.1:{self.port}"

    async def _listen(self) -> None:
        self._site = web.TCPSite(self._runner, "127.0.0.1", self.port, ssl_context=self.tls)
        await self._site.start()
        self.port = self._site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def close_port(self) -> None:
        """Stop listening and close open connections, as a peer that dies does: connections
        are refused."""
        asyncio.run_coroutine_threadsafe(self._site.stop(), self._loop).result(10)
        server = self._runner.server
        assert server is not None
        asyncio.run_coroutine_threadsafe(server.shutdown(1), self._loop).result(10)

    def open_port(self) -> None:
        asyncio.run_coroutine_threadsafe(self._listen(), self._loop).result(10)

    async def _stop(self) -> None:
        assert self._release is not None
        self._release.set()
        await self._runner.cleanup()

    def __enter__(self) -> HostilePeer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


async def infer_frames(http, count: int) -> None:
    """``count`` tiny frames as v2 JSON requests through a client session to a daemon."""
    for x in frames(count):
        tensor = {"name": "input", "shape": [1, 3, 8, 8], "datatype": "FP32"}
        body = {"inputs": [{**tensor, "data": x.ravel().tolist()}]}
        async with http.post("/v2/models/tiny/infer", json=body) as response:
            assert response.status == 200, await response.text()
