"""The broker side of the update channel under attack, on a real Mosquitto (issue 10 items 7
and 12): Maximum-Packet-Size keeps oversized messages off the device, the shipped ACL template
lets a device write only its own topics, and the hub's tools survive hostile retained reports.

Non-delivery is proven without waiting: the forbidden message is published first and a
permitted *marker* after it from the same client; MQTT delivers one publisher's QoS 1 messages
in order, so once the marker has arrived the forbidden one would have too.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.broker import Broker
from devtools.waiting import until
from edgeagent.fleet.mqtt import MqttLink
from edgeagent.fleet.settings import MqttSettings
from edgeagent.fleet.topics import DeviceTopics, GroupTopics, Topics
from edgeagent.hub.publish import hub_client, publish
from edgeagent.hub.status import collect_fleet
from tests.support.mqtt import Device

pytestmark = pytest.mark.broker

ACL = Path(__file__).resolve().parents[2] / "deploy" / "mosquitto" / "edgeagent.acl"
HUB_USER = "edgeagent-hub"
SECRET = "pw-for-tests"


async def test_the_broker_never_delivers_a_message_over_the_size_cap(broker: Broker, devices):
    """Before: the device received the whole 200 KB message, then dropped it."""
    settings = broker.settings(max_message_bytes=1000)
    device = await Device(settings).start()
    devices.append(device)
    await asyncio.wait_for(device.link.connected.wait(), 10)
    await publish(settings, [device.topics.of_device.release], b"x" * 200_000)
    await publish(settings, [device.topics.of_device.release], b"marker")
    await until(lambda: device.received)
    assert device.received == [(device.topics.device_release, b"marker")]
    assert device.link.oversized == 0  # the broker dropped it; it never reached the agent


async def test_hub_status_skips_hostile_retained_reports(broker: Broker) -> None:
    """Item 7: {"updates": 1}, 100k-deep nesting and non-JSON used to crash the tool."""
    settings = broker.settings()
    hostile = {
        "evil-1": json.dumps({"updates": 1}).encode(),
        "evil-2": b"[" * 100_000 + b"]" * 100_000,
        "evil-3": b"\xff not json",
        "evil-4": json.dumps({"updates": {"last": [1]}, "group": "lab"}).encode(),
        "evil-5": json.dumps({"models": {"m": {"active_version": {"x": 1}}}}).encode(),
    }
    good = json.dumps({"group": "lab", "updates": {"last": {"result": "succeeded"}}}).encode()
    async with hub_client(settings, "test") as client:
        for device, payload in hostile.items():
            await client.publish(
                DeviceTopics("edgeagent", device).state.name, payload, retain=True, qos=1
            )
        await client.publish(
            DeviceTopics("edgeagent", "dev-ok").state.name, good, retain=True, qos=1
        )
    rows = await collect_fleet(settings, wait_s=1.0)
    by_id = {row["device_id"]: row for row in rows}
    assert by_id["dev-ok"]["last_result"] == "succeeded"
    assert set(by_id) <= {"dev-ok", "evil-5"}  # evil-5 parses; its odd version is blanked
    assert all(row["models"].get("m") is None for row in rows)


# ---- the ACL template on a real Mosquitto ------------------------------------------------


@pytest.fixture
def acl_broker(tmp_path: Path) -> Iterator[Broker]:
    """A Mosquitto with a password per device and the shipped ACL file, unchanged."""
    broker = Broker(tmp_path / "acl-broker")
    passwords = broker.workdir / "acl-passwords"
    passwords.write_text("")
    passwords.chmod(0o600)
    for user in (HUB_USER, "dev-1", "dev-2"):
        subprocess.run(
            ["mosquitto_passwd", "-b", str(passwords), user, SECRET],
            check=True,
            capture_output=True,
        )
    head = broker.config.read_text().split("\nlistener ", 1)[0]
    broker.config.write_text(
        f"{head}\nlistener {broker.port} 127.0.0.1\nallow_anonymous false\n"
        f"password_file {passwords}\nacl_file {ACL}\n"
    )
    broker.start()
    yield broker
    broker.stop()


def _as(broker: Broker, user: str) -> MqttSettings:
    return broker.settings(username=user, password=SECRET)


async def _collect(
    settings: MqttSettings, topic: str, marker: bytes, ready: asyncio.Event
) -> list[tuple[str, bytes]]:
    """Subscribe as ``settings``' user and return what arrives up to and including ``marker``."""
    received: list[tuple[str, bytes]] = []
    async with hub_client(settings, "watch") as client:
        await client.subscribe(topic, qos=1)
        ready.set()
        async for message in client.messages:
            received.append((message.topic.value, bytes(message.payload)))  # type: ignore[arg-type]
            if message.payload == marker:
                return received
    return received


async def _watch(settings: MqttSettings, topic: str, marker: bytes) -> asyncio.Task:
    ready = asyncio.Event()
    task = asyncio.create_task(_collect(settings, topic, marker, ready))
    await asyncio.wait_for(ready.wait(), 10)
    return task


async def _raw_publish(settings: MqttSettings, messages: list[tuple[str, bytes]]) -> None:
    async with hub_client(settings, "raw") as client:
        for topic, payload in messages:
            await client.publish(topic, payload, qos=1)


async def test_a_device_writes_only_its_own_topics(acl_broker: Broker) -> None:
    hub = _as(acl_broker, HUB_USER)
    watcher = await _watch(hub, "edgeagent/device/+/#", b"marker")
    dev1 = _as(acl_broker, "dev-1")
    await _raw_publish(
        dev1,
        [
            (DeviceTopics("edgeagent", "dev-2").events.name, b"forged outcome for dev-2"),
            (DeviceTopics("edgeagent", "dev-2").state.name, b"forged state for dev-2"),
            (DeviceTopics("edgeagent", "dev-2").release.name, b"a release for dev-2"),
            (DeviceTopics("edgeagent", "dev-1").events.name, b"marker"),
        ],
    )
    received = await asyncio.wait_for(watcher, 10)
    assert received == [("edgeagent/device/dev-1/events", b"marker")]


async def test_only_the_hub_writes_release_and_trust_topics(acl_broker: Broker) -> None:
    dev2 = _as(acl_broker, "dev-2")
    group = GroupTopics("edgeagent", "lab")
    release = group.release("tiny").name
    watcher = await _watch(dev2, "edgeagent/#", b"marker")
    await _raw_publish(
        _as(acl_broker, "dev-1"),
        [(release, b"device-made release"), (group.trust.name, b"device-made trust")],
    )
    await _raw_publish(_as(acl_broker, HUB_USER), [(release, b"marker")])
    received = await asyncio.wait_for(watcher, 10)
    assert received == [(release, b"marker")]


async def test_the_agent_link_works_under_the_acl(acl_broker: Broker) -> None:
    """The device's own link (subscriptions, retained state, Last Will) is allowed."""
    settings = _as(acl_broker, "dev-1")
    received: list[tuple[str, bytes]] = []

    async def handle(topic: str, payload: bytes) -> None:
        received.append((topic, payload))

    link = MqttLink(settings, Topics("edgeagent", "lab", "dev-1"), handle)
    task = asyncio.create_task(link.run())
    try:
        await asyncio.wait_for(link.connected.wait(), 10)
        topic = GroupTopics("edgeagent", "lab").release("tiny")
        await publish(_as(acl_broker, HUB_USER), [topic], b"r1")
        await until(lambda: received)
        assert received == [("edgeagent/group/lab/release/tiny", b"r1")]
    finally:
        await link.close()
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
