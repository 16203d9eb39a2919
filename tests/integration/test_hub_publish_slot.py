"""Issue 23, finding 7: ``hub publish`` retained a replay. After a rollback (serial 3),
publishing the serial-2 envelope exited 0 and left it in the group's retained slot, where a
device that starts later installs it while the fleet is on the rollback version. Now the slot
is read first and a serial that is not above the retained one is refused, nothing published."""

from __future__ import annotations

import asyncio
import json

import aiomqtt
import pytest

from devtools.broker import Broker
from edgeagent.fleet.topics import GroupTopics
from tests.integration.test_hub import hub as hub_cli
from tests.integration.test_release_v2 import _publish, _retained, _sign
from tests.integration.test_updates_helpers import Hub, hub_fixture  # noqa: F401 - fixture

pytestmark = [pytest.mark.broker, pytest.mark.timeout(120)]

SLOT = GroupTopics("edgeagent", "lab").release("tiny").name


async def _rollback_to_1(hub: Hub, broker: Broker) -> dict:
    rolled = await asyncio.to_thread(
        hub_cli,
        *("rollback", "tiny", "--to", "1", "--group", "lab"),
        *("--release-key", str(hub.keys / "release.key"), "--artifacts", str(hub.artifacts)),
        *("--trust", str(hub.keys / "trust.json"), "--broker", f"127.0.0.1:{broker.port}"),
        "--json",
    )
    assert rolled.returncode == 0, rolled.stderr
    return json.loads(rolled.stdout)


async def test_a_replay_into_the_retained_slot_is_refused(hub: Hub, broker: Broker) -> None:
    v1 = _sign(hub, "1")
    assert (await _publish(hub, broker, v1)).returncode == 0
    v2 = _sign(hub, "2")
    v2_envelope = v2.read_bytes()
    published = await _publish(hub, broker, v2)  # control: a fresh serial replaces the slot
    assert published.returncode == 0, published.stderr
    assert json.loads(published.stdout)["serial"] == 2
    assert await _retained(broker, SLOT) == v2_envelope

    assert (await _rollback_to_1(hub, broker))["serial"] == 3
    rollback = await _retained(broker, SLOT)
    assert rollback is not None and rollback != v2_envelope

    replayed = await _publish(hub, broker, v2)
    assert replayed.returncode == 2, replayed.stdout
    assert "holds tiny 1 serial 3" in replayed.stderr
    assert "serial 2 is not above it" in replayed.stderr
    again = await _publish(hub, broker, v1)  # the rollback's own file: serial 3 again
    assert again.returncode == 2 and "serial 3 is not above it" in again.stderr
    assert await _retained(broker, SLOT) == rollback  # state unchanged


async def test_a_device_topic_is_not_published_when_the_slot_refuses(
    hub: Hub, broker: Broker
) -> None:
    """One refusal stops the whole command: no device topic gets the replay either."""
    v1 = _sign(hub, "1")
    v2 = _sign(hub, "2")
    assert (await _publish(hub, broker, v2)).returncode == 0
    device_topic = "edgeagent/device/dev-9/release"
    async with aiomqtt.Client("127.0.0.1", broker.port) as device:
        await device.subscribe(device_topic, qos=1)
        refused = await _publish(hub, broker, v1, "--device", "dev-9")
        assert refused.returncode == 2 and "not above it" in refused.stderr
        marker = b"marker"
        await device.publish(device_topic, marker, qos=1)
        async for message in device.messages:  # the first one: the replay, or the marker
            assert bytes(message.payload) == marker  # type: ignore[arg-type]
            break


@pytest.mark.parametrize(
    "held",
    [b"not a release", b'{"payload": "e30=", "signatures": [1]}', "other-model"],
)
async def test_a_slot_without_a_release_of_the_model_does_not_block(
    hub: Hub, broker: Broker, held: bytes | str
) -> None:
    """Bytes devices would refuse anyway (garbage, another model's release) are no floor."""
    if held == "other-model":
        held = _sign(hub, "7", "other").read_bytes()
    async with aiomqtt.Client("127.0.0.1", broker.port) as client:
        await client.publish(SLOT, held, qos=1, retain=True)
    v1 = _sign(hub, "1")
    published = await _publish(hub, broker, v1)
    assert published.returncode == 0, published.stderr
    assert await _retained(broker, SLOT) == v1.read_bytes()
