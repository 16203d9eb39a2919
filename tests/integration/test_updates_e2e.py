"""Signed updates through the whole product: real daemon process, real Mosquitto, the hub CLI.

publish → the device verifies, downloads, installs, hot-swaps → serves the new version over
its Unix socket, with zero failed requests during the swap; and the agent SIGKILLed at each
install step, then restarted, always serves a verified version.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from devtools.agent_process import spawn_agent_async
from devtools.broker import Broker
from devtools.waiting import until
from edgeagent.fleet.topics import GroupTopics
from edgeagent.hub.publish import publish
from edgeagent.hub.status import collect_fleet
from edgeagent.updates.install import KILL_ENV
from tests.integration.test_updates_helpers import Hub, add_golden, hub_fixture  # noqa: F401
from tests.support.helpers import write_tiny_package

pytestmark = pytest.mark.broker
REPO = Path(__file__).resolve().parents[2]
DEVICE_ID = "dev-e2e"


class Agent:
    """One ``edgeagent run`` process with updates enabled, and a client for its socket."""

    def __init__(self, root: Path, broker: Broker, hub: Hub) -> None:
        self.root = root
        self.socket = root / "agent.sock"
        self.state = root / "state"
        models = root / "models"
        if not models.exists():
            add_golden(write_tiny_package(models / "tiny", "tiny", "1", seed=1))
        self.config = root / "agent.toml"
        self.config.write_text(
            f"""[agent]
state_dir = "{self.state}"
models_dir = "{models}"
device_id = "{DEVICE_ID}"

[server]
unix_socket = "{self.socket}"
tcp_port = 0

{hub.device_tables(broker.port)}"""
        )
        self.process: asyncio.subprocess.Process | None = None

    async def start(self, **env: str) -> Agent:
        self.process = await spawn_agent_async(
            ["--config", str(self.config)],
            extra_env=env,
            cwd=self.root,
            stdout=subprocess.PIPE,
            stderr=open(self.root / "agent.log", "ab"),  # noqa: SIM115
        )
        assert self.process.stdout is not None
        line = await asyncio.wait_for(self.process.stdout.readline(), 60)
        assert line.startswith(b"edgeagent serving"), line + self.log().encode()
        return self

    def log(self) -> str:
        path = self.root / "agent.log"
        return path.read_text(errors="replace")[-4000:] if path.exists() else ""

    async def get(self, path: str) -> dict[str, Any]:
        connector = aiohttp.UnixConnector(path=str(self.socket))
        async with (
            aiohttp.ClientSession(connector=connector) as http,
            http.get(f"http://agent{path}") as response,
        ):
            return await response.json()

    async def version(self) -> str:
        return (await self.get("/v2/models/tiny"))["versions"][0]

    async def wait_version(self, version: str, timeout: float = 60) -> None:
        async def serving() -> bool:
            with contextlib.suppress(aiohttp.ClientError, KeyError, IndexError):
                return await self.version() == version
            return False

        try:
            await until(serving, timeout)
        except AssertionError:
            status = await self.get("/v1/status")
            raise AssertionError(
                f"not serving {version}: {status.get('updates')}\n{self.log()}"
            ) from None

    async def killed(self, timeout: float = 60) -> int:
        assert self.process is not None
        return await asyncio.wait_for(self.process.wait(), timeout)

    async def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.process.wait(), 30)
            except asyncio.TimeoutError:
                self.process.kill()
                await self.process.wait()


@pytest.fixture
async def agent(tmp_path: Path, broker: Broker, hub: Hub) -> AsyncIterator[Agent]:
    instance = Agent(tmp_path / "device", broker, hub)
    yield instance
    await instance.stop()


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "edgeagent.cli", "hub", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


async def infer_forever(agent: Agent, counts: dict[str, int], stop: asyncio.Event) -> None:
    """Keep requests in flight over the socket; count answers by status."""
    body = {
        "inputs": [
            {
                "name": "input",
                "shape": [1, 3, 8, 8],
                "datatype": "FP32",
                "data": np.zeros(192, dtype=np.float32).tolist(),
            }
        ]
    }
    connector = aiohttp.UnixConnector(path=str(agent.socket))
    async with aiohttp.ClientSession(connector=connector) as http:
        while not stop.is_set():
            async with http.post("http://agent/v2/models/tiny/infer", json=body) as response:
                await response.read()
                key = "ok" if response.status == 200 else f"http_{response.status}"
                counts[key] = counts.get(key, 0) + 1


async def test_publish_with_the_hub_cli_then_the_device_serves_the_new_version(
    agent: Agent, hub: Hub, broker: Broker
) -> None:
    await agent.start()
    assert await agent.version() == "1"
    package = add_golden(hub.package("2", seed=2))
    signed = await asyncio.to_thread(cli, *hub.sign_command(package))
    assert signed.returncode == 0, signed.stderr
    release = json.loads(signed.stdout)["release"]

    counts: dict[str, int] = {}
    stop = asyncio.Event()
    load = [asyncio.create_task(infer_forever(agent, counts, stop)) for _ in range(4)]
    await until(lambda: counts.get("ok", 0) >= 4)  # the load is flowing before the publish
    published = await asyncio.to_thread(cli, *hub.publish_command(release, broker.port))
    assert published.returncode == 0, published.stderr
    await agent.wait_version("2")
    served = counts.get("ok", 0)
    await until(lambda: counts.get("ok", 0) >= served + 8)  # ...and goes on after the swap
    stop.set()
    await asyncio.gather(*load)
    assert counts.get("ok", 0) > 10 and set(counts) == {"ok"}, counts

    status = await agent.get("/v1/status")
    assert status["updates"]["last"]["result"] == "succeeded"
    fleet = await asyncio.to_thread(
        cli, "status", "--broker", f"127.0.0.1:{broker.port}", "--json", "--wait", "1"
    )
    rows = json.loads(fleet.stdout)
    assert rows[0]["device_id"] == DEVICE_ID and rows[0]["models"] == {"tiny": "2"}
    assert rows[0]["last_result"] == "succeeded" and rows[0]["online"]


async def test_an_attack_is_reported_over_mqtt_and_the_device_keeps_serving(
    agent: Agent, hub: Hub, broker: Broker
) -> None:
    await agent.start()
    envelope = hub.release("2")
    artifact = next(hub.artifacts.glob("tiny-2*.tar.gz"))
    data = bytearray(artifact.read_bytes())
    data[len(data) // 2] ^= 0xFF
    artifact.write_bytes(bytes(data))
    await publish(broker.settings(), [GroupTopics("edgeagent", "lab").release("tiny")], envelope)
    for _ in range(100):
        rows = await collect_fleet(broker.settings(), group="lab", wait_s=0.3)
        if rows and rows[0]["last_code"]:
            break
    assert (rows[0]["last_result"], rows[0]["last_code"]) == ("refused", "hash_mismatch")
    assert await agent.version() == "1"


# Where the SIGKILL lands → what the restarted agent must serve. A crash while the new model
# loads marks it bad (it may be the cause), so the re-delivered release is refused; a crash
# at any other step is undone and the re-delivered release installs.
KILL_POINTS = {
    "verified": "2",
    "downloaded": "2",
    "unpacked": "2",
    "installed": "2",
    "activating": "1",
    "activated": "1",
    "committing": "2",
    "committed": "2",
}


@pytest.mark.parametrize("step", list(KILL_POINTS))
async def test_sigkill_at_each_install_step_then_restart_serves_a_verified_version(
    agent: Agent, hub: Hub, broker: Broker, step: str
) -> None:
    await agent.start(**{KILL_ENV: step})
    await publish(
        broker.settings(), [GroupTopics("edgeagent", "lab").release("tiny")], hub.release("2")
    )
    assert await agent.killed() == -signal.SIGKILL
    await agent.start()
    expected = KILL_POINTS[step]
    await agent.wait_version(expected)
    final = "known_bad" if expected == "1" else "committed"

    async def settled() -> dict:
        while True:
            updates = (await agent.get("/v1/status"))["updates"]
            if (updates["last"] or {}).get("code") == final and not updates["queued"]:
                return updates
            await asyncio.sleep(0.1)

    updates = await asyncio.wait_for(settled(), 60)
    assert updates["pending"] is None and updates["installed"]["tiny"] in (expected, None)
    assert await agent.version() == expected
    if expected == "1":  # the recovery was reported before the refusal
        codes = [h["code"] for h in updates["history"]]
        assert "recovered_rolled_back" in codes
