"""Update locks over the real daemon's Unix socket: a held lock defers a swap until it is
released, and a lock past [updates] max_lock_hold_s is broken with a log line (real
``edgeagent run`` process, real Mosquitto, the hub's signing and publishing)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from devtools.broker import Broker
from devtools.waiting import until
from edgeagent.fleet.topics import GroupTopics
from edgeagent.hub.publish import publish
from tests.integration.test_updates_e2e import Agent
from tests.integration.test_updates_helpers import Hub, add_golden, hub_fixture  # noqa: F401

pytestmark = pytest.mark.broker
MAX_HOLD_S = 60  # the first test releases its lock by hand
SHORT_HOLD_S = 6  # the second waits for the break: long enough to see the release wait


async def call(agent: Agent, method: str, path: str, **kwargs: Any) -> tuple[int, dict]:
    connector = aiohttp.UnixConnector(path=str(agent.socket))
    async with (
        aiohttp.ClientSession(connector=connector) as http,
        http.request(method, f"http://agent{path}", **kwargs) as response,
    ):
        return response.status, await response.json()


@pytest.fixture
async def agent(request, tmp_path: Path, broker: Broker, hub: Hub) -> AsyncIterator[Agent]:
    """The daemon with ``[updates] max_lock_hold_s`` = the test's ``max_hold`` marker."""
    max_hold = request.node.get_closest_marker("max_hold").args[0]
    instance = Agent(tmp_path / "device", broker, hub)
    config = instance.config.read_text()
    instance.config.write_text(
        config.replace("[mqtt]", f"max_lock_hold_s = {max_hold}\n\n[mqtt]", 1)
    )
    yield await instance.start()
    await instance.stop()


def _release(hub: Hub, version: str) -> bytes:
    return hub.sign(add_golden(hub.package(version, seed=int(version))))


async def _publish(broker: Broker, envelope: bytes) -> None:
    await publish(broker.settings(), [GroupTopics("edgeagent", "lab").release("tiny")], envelope)


async def _step(agent: Agent) -> str | None:
    current = (await agent.get("/v1/status"))["updates"].get("current") or {}
    return current.get("state")


@pytest.mark.max_hold(MAX_HOLD_S)
async def test_a_held_lock_defers_the_swap_until_it_is_released(
    agent: Agent, hub: Hub, broker: Broker
) -> None:
    status, body = await call(
        agent, "POST", "/v1/update-lock", json={"holder": "scale", "hold_s": 2, "reason": "x"}
    )
    assert status == 200 and body["lock"]["holder"] == "scale", body
    assert body["max_hold_s"] == MAX_HOLD_S
    status, body = await call(
        agent, "POST", "/v1/update-lock", json={"holder": "scale", "hold_s": MAX_HOLD_S + 1}
    )
    assert status == 400 and "max_lock_hold_s" in body["error"]
    # renewed to the maximum: the release below must wait for the DELETE, not an expiry
    await call(agent, "POST", "/v1/update-lock", json={"holder": "scale", "hold_s": MAX_HOLD_S})

    await _publish(broker, _release(hub, "2"))
    await until(lambda: _deferred(agent), 30, what="the release deferred by the lock")
    assert await agent.version() == "1"
    status, body = await call(agent, "GET", "/v1/update-lock")
    assert [lock["holder"] for lock in body["locks"]] == ["scale"]
    status, body = await call(agent, "DELETE", "/v1/update-lock", params={"holder": "scale"})
    assert status == 200 and body["locks"] == []
    await agent.wait_version("2")
    status, _ = await call(agent, "DELETE", "/v1/update-lock", params={"holder": "scale"})
    assert status == 404


async def _deferred(agent: Agent) -> bool:
    return await _step(agent) == "deferred"


@pytest.mark.max_hold(SHORT_HOLD_S)
async def test_a_lock_past_its_maximum_hold_is_broken_with_a_log_line(
    agent: Agent, hub: Hub, broker: Broker
) -> None:
    # The release is built and signed before the lock is taken: the lock's short life must
    # cover only the delivery to the gate, which a loaded machine's packaging outlasted.
    envelope = _release(hub, "2")
    hold = {"holder": "forgetful", "hold_s": SHORT_HOLD_S}
    assert (await call(agent, "POST", "/v1/update-lock", json=hold))[0] == 200
    await _publish(broker, envelope)
    await until(lambda: _deferred(agent), 30, what="the release deferred by the lock")
    await agent.wait_version("2")  # nobody released it
    # The version answers before the install's last log line is written: wait for the line.
    await until(lambda: "update tiny 2 succeeded" in agent.log(), 30, what="the install's log")
    log = agent.log()
    assert "update lock of forgetful broken" in log
    assert log.index("update lock of forgetful broken") < log.index("update tiny 2 succeeded")
    _status, body = await call(agent, "GET", "/v1/update-lock")
    assert body["locks"] == []
