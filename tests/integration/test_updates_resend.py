"""A real agent (``edgeagent run``) over a real Mosquitto: a re-send of the committed envelope
is answered ``same_version`` without a reinstall, and the state report is re-published on a
heartbeat (issue 23), so the hub's "last seen" moves while nothing changes."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiomqtt
import pytest

from devtools.broker import Broker
from edgeagent.fleet.topics import DeviceTopics, GroupTopics
from edgeagent.hub.publish import publish
from tests.integration.test_updates_e2e import DEVICE_ID, Agent
from tests.integration.test_updates_helpers import Hub, hub_fixture  # noqa: F401 - fixture

pytestmark = pytest.mark.broker
TOPICS = DeviceTopics("edgeagent", DEVICE_ID)


def agent_with(root: Path, broker: Broker, hub: Hub, **updates: float) -> Agent:
    """The e2e agent, with extra ``[updates]`` keys (its config names the section once)."""
    agent = Agent(root, broker, hub)
    text = agent.config.read_text()
    lines = "".join(f"{key} = {value}\n" for key, value in updates.items())
    assert "[updates]\nenabled = true\n" in text
    agent.config.write_text(
        text.replace("[updates]\nenabled = true\n", f"[updates]\n{lines}enabled = true\n")
    )
    return agent


@pytest.fixture
async def watcher(broker: Broker) -> AsyncIterator[aiomqtt.Client]:
    """A client subscribed to the device's events and state before the agent starts."""
    async with aiomqtt.Client("127.0.0.1", broker.port) as client:
        await client.subscribe(TOPICS.events.name, qos=1)
        await client.subscribe(TOPICS.state.name, qos=1)
        yield client


async def next_message(
    client: aiomqtt.Client, topic: str, match=lambda document: True, timeout: float = 60
) -> dict:
    """The next message on ``topic`` whose JSON ``match``es, within ``timeout`` seconds."""

    async def read() -> dict:
        async for message in client.messages:
            if message.topic.value == topic:
                document = json.loads(bytes(message.payload))  # type: ignore[arg-type]
                if match(document):
                    return document
        raise AssertionError("the subscription ended")

    return await asyncio.wait_for(read(), timeout)


def done(event: dict) -> bool:
    return event.get("step") == "done"


async def test_a_resent_committed_envelope_is_answered_same_version(
    tmp_path: Path, broker: Broker, hub: Hub, watcher: aiomqtt.Client
) -> None:
    agent = agent_with(tmp_path / "device", broker, hub, state_interval_s=0)
    try:
        await agent.start()
        envelope = hub.release("2")
        slot = GroupTopics("edgeagent", "lab").release("tiny")
        await publish(broker.settings(), [slot], envelope)
        committed = await next_message(watcher, TOPICS.events.name, done)
        assert (committed["result"], committed["code"]) == ("succeeded", "committed"), committed
        await agent.wait_version("2")

        await publish(broker.settings(), [TOPICS.release], envelope)  # the hub's re-send
        answer = await next_message(watcher, TOPICS.events.name, done)
        assert (answer["result"], answer["code"]) == ("refused", "same_version"), answer
        assert answer["deployment_id"] == committed["deployment_id"]
        assert "nothing reinstalled" in answer["message"]
        status = await agent.get("/v1/status")
        assert await agent.version() == "2"
        assert status["updates"]["last"]["code"] == "committed"  # the saved outcome stays
        assert [o["code"] for o in status["updates"]["history"]] == ["committed"]
    finally:
        await agent.stop()


async def test_the_state_report_is_republished_on_a_heartbeat(
    tmp_path: Path, broker: Broker, hub: Hub, watcher: aiomqtt.Client
) -> None:
    """Nothing changes on the device, yet fresh reports keep coming, each within the bound."""
    agent = agent_with(tmp_path / "device", broker, hub, state_interval_s=1, max_state_bytes=4096)
    try:
        await agent.start()
        seen = [time.time()]  # serving: start-up's reports are out, nothing changes any more
        for _ in range(3):  # fresh reports, spread out in time: only a heartbeat sends them
            report = await next_message(
                watcher, TOPICS.state.name, lambda r: r["updated_at"] >= seen[-1] + 0.5, 30
            )
            seen.append(report["updated_at"])
            assert len(json.dumps(report)) <= 4096
        assert report["models"]["tiny"]["active_version"] == "1"
    finally:
        await agent.stop()
