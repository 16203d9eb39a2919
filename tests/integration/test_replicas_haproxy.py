"""Three agents behind HAProxy (Debian's): a replica reloading a model and a replica stopping
lose no request of a steady load at concurrency 8.

Each scenario sends requests through HAProxy from 8 workers, does its action once a first batch
of answers is in, and keeps sending until a second batch after the action: every request is
answered 200 with the model's output, counted, not timed. HAProxy health-checks
``/v2/health/ready`` and retries a connection the stopping replica refused; the replica drains
what it already took.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from devtools.agent_process import Agent
from devtools.haproxy import HAProxy, haproxy_binary
from devtools.ports import free_port
from devtools.tiny import write_tiny_package
from devtools.waiting import until

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(haproxy_binary() is None, reason="haproxy is not installed"),
]

TOKEN = "replica-test-token"
CONCURRENCY = 8
BEFORE, AFTER = 40, 120  # answers before the action, and after it (bounded, not timed)
HEADERS = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
BODY = {
    "inputs": [{"name": "input", "shape": [1, 3, 8, 8], "datatype": "FP32", "data": [0.5] * 192}]
}


class Site:
    """Three replicas of the tiny model, each its own ``edgeagent run``, and HAProxy."""

    def __init__(self, root: Path) -> None:
        self.replicas: list[Agent] = []
        self.models: list[Path] = []
        ports = []
        for index in range(3):
            here = root / f"r{index}"
            models = here / "models"
            write_tiny_package(models / "tiny")
            config = here / "agent.toml"
            config.write_text(
                f"[agent]\nmodels_dir = '{models}'\n"
                f"[server]\ntoken = '{TOKEN}'\ndrain_timeout_s = 30\n"
            )
            port = free_port()
            self.replicas.append(Agent(here, config, port=port))
            self.models.append(models)
            ports.append(port)
        self.proxy = HAProxy(root / "haproxy", ports, TOKEN)

    def close(self) -> None:
        self.proxy.stop()
        for replica in self.replicas:
            if replica.process.poll() is None:
                replica.stop()


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    built = Site(tmp_path)
    yield built
    built.close()


async def load_around(site: Site, action: Callable[[], Awaitable[None]]) -> list[int]:
    """Send requests from CONCURRENCY workers; run ``action`` after BEFORE answers; stop AFTER
    answers later. Returns every status seen (a connection error counts as 0)."""
    statuses: list[int] = []
    acted = asyncio.Event()
    enough_before = asyncio.Event()
    after_count: list[int] = []

    async def worker(session: aiohttp.ClientSession) -> None:
        while not (acted.is_set() and len(after_count) >= AFTER):
            try:
                async with session.post("/v2/models/tiny/infer", json=BODY) as answer:
                    status = answer.status
                    if status == 200:  # HAProxy's own 502/503 pages are HTML: counted only
                        body = await answer.json()
                        logits = np.asarray(body["outputs"][0]["data"])
                        assert logits.shape == (4,) and np.all(np.isfinite(logits))
            except aiohttp.ClientError:
                status = 0
            statuses.append(status)
            if len(statuses) >= BEFORE:
                enough_before.set()
            if acted.is_set():
                after_count.append(status)

    async def act() -> None:
        await enough_before.wait()
        await action()
        acted.set()

    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(site.proxy.url, headers=HEADERS, timeout=timeout) as session:
        await until(lambda: ready(session), what="HAProxy answering ready")
        await asyncio.gather(act(), *(worker(session) for _ in range(CONCURRENCY)))
    return statuses


async def ready(session: aiohttp.ClientSession) -> bool:
    try:
        async with session.get("/v2/health/ready") as answer:
            return answer.status == 200
    except aiohttp.ClientError:
        return False


async def test_a_replica_stopping_loses_no_request(site: Site) -> None:
    stopping = site.replicas[0]

    async def stop() -> None:  # SIGTERM, and wait for the replica to have exited
        assert await asyncio.to_thread(stopping.stop) == 0

    statuses = await load_around(site, stop)
    assert len(statuses) >= BEFORE + AFTER
    assert set(statuses) == {200}, {s: statuses.count(s) for s in set(statuses)}
    down = {row["svname"]: row["status"] for row in site.proxy.show_stat()}
    assert down["r0"].startswith("DOWN"), down


async def test_a_replica_reloading_its_model_loses_no_request(site: Site) -> None:
    replica, models = site.replicas[1], site.models[1]

    async def reload() -> None:  # a new version of the model, hot-swapped on SIGHUP
        shutil.rmtree(models / "tiny")
        write_tiny_package(models / "tiny", version="2", seed=7)
        line = await asyncio.to_thread(replica.hup_and_wait_for, "reloaded: serving")
        assert "tiny 2" in line, line

    statuses = await load_around(site, reload)
    assert len(statuses) >= BEFORE + AFTER
    assert set(statuses) == {200}, {s: statuses.count(s) for s in set(statuses)}
