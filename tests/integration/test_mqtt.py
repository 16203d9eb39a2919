"""The device's MQTT link against a real Mosquitto: TLS + client cert + password, persistent
session across disconnects and broker restarts, retained state, and the Last Will."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import aiomqtt
import pytest

from devtools.broker import Broker
from devtools.waiting import until
from edgeagent.fleet.mqtt import backoff_delays
from edgeagent.fleet.settings import MqttSettings
from edgeagent.fleet.topics import Topics
from edgeagent.hub.publish import hub_client, publish
from edgeagent.hub.status import collect_fleet
from tests.support.mqtt import Device

pytestmark = pytest.mark.broker


async def retained(settings: MqttSettings, topic: str) -> bytes:
    async with hub_client(settings, "test") as client:
        await client.subscribe(topic, qos=1)
        async for message in client.messages:
            return bytes(message.payload)  # type: ignore[arg-type]
    raise AssertionError("no message")


async def test_tls_with_client_certificate_and_password(broker: Broker, devices) -> None:
    settings = broker.tls_settings()
    device = await Device(settings).start()
    devices.append(device)
    await asyncio.wait_for(device.link.connected.wait(), 15)
    device.link.publish_state({"device_id": "dev-1", "group": "lab", "models": {}})
    state = json.loads(await asyncio.wait_for(retained(settings, device.topics.state), 10))
    assert state["device_id"] == "dev-1"
    online = await asyncio.wait_for(retained(settings, device.topics.availability), 10)
    assert online == b"online"


@pytest.mark.parametrize(
    "change",
    [{"cert_file": None, "key_file": None}, {"password": "wrong"}],
    ids=["no-client-cert", "wrong-password"],
)
async def test_tls_listener_refuses_incomplete_credentials(broker: Broker, devices, change) -> None:
    device = await Device(broker.tls_settings(**change)).start()
    devices.append(device)
    await until(lambda: device.link.last_error != "", timeout=15)
    assert not device.link.connected.is_set() and device.link.connections == 0


async def test_a_release_sent_while_offline_arrives_on_reconnect(broker: Broker, devices) -> None:
    settings = broker.settings()
    device = await Device(settings).start()
    devices.append(device)  # stopped again at teardown if the wait below fails (stop is idempotent)
    await asyncio.wait_for(device.link.connected.wait(), 10)
    await device.stop()  # the broker keeps the persistent session

    await publish(settings, [device.topics.of_device.release], b"release-for-dev-1")
    await publish(settings, [device.topics.of_group.release("tiny")], b"group-release")

    device = await Device(settings).start()
    devices.append(device)
    await until(lambda: len(device.received) >= 2)
    assert (device.topics.device_release, b"release-for-dev-1") in device.received
    assert (device.topics.of_group.release("tiny").name, b"group-release") in device.received


async def test_the_link_survives_a_broker_restart(broker: Broker, devices) -> None:
    settings = broker.settings()
    device = await Device(settings).start()
    devices.append(device)
    await asyncio.wait_for(device.link.connected.wait(), 10)
    device.link.publish_state({"device_id": "dev-1", "group": "lab", "n": 1})

    await asyncio.to_thread(broker.restart)
    await until(lambda: device.link.connections >= 2 and device.link.connected.is_set())
    device.link.publish_event({"step": "after-restart"})
    await publish(settings, [device.topics.of_device.release], b"after-restart")
    await until(lambda: (device.topics.device_release, b"after-restart") in device.received)
    rows = await collect_fleet(settings, group="lab", wait_s=0.5)
    assert [r["device_id"] for r in rows] == ["dev-1"] and rows[0]["online"]


async def test_oversized_messages_are_dropped_unread(broker: Broker, devices) -> None:
    settings = broker.settings(max_message_bytes=100)
    device = await Device(settings).start()
    devices.append(device)
    await asyncio.wait_for(device.link.connected.wait(), 10)
    await publish(settings, [device.topics.of_device.release], b"x" * 101)
    await publish(settings, [device.topics.of_device.release], b"small")
    await until(lambda: device.received)
    assert device.received == [(device.topics.device_release, b"small")]


LINK_SCRIPT = """
import asyncio, sys
from edgeagent.fleet.mqtt import MqttLink, backoff_delays
from edgeagent.fleet.topics import Topics
from edgeagent.fleet.settings import MqttSettings

async def main():
    settings = MqttSettings(host="127.0.0.1", port=int(sys.argv[1]), keepalive_s=5)
    async def ignore(topic, payload):
        pass
    link = MqttLink(settings, Topics("edgeagent", "lab", "dev-will"), ignore)
    task = asyncio.create_task(link.run())
    await link.connected.wait()
    print("connected", flush=True)
    await task

asyncio.run(main())
"""


async def test_a_killed_device_is_reported_offline_by_its_last_will(broker: Broker) -> None:
    settings = broker.settings()
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        LINK_SCRIPT,
        str(broker.port),
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert process.stdout is not None
    assert await asyncio.wait_for(process.stdout.readline(), 30) == b"connected\n"
    topic = "edgeagent/device/dev-will/availability"
    assert await asyncio.wait_for(retained(settings, topic), 10) == b"online"
    process.kill()
    await process.wait()
    async with hub_client(settings, "will") as client:
        await client.subscribe(topic, qos=1)
        async with asyncio.timeout(15):
            async for message in client.messages:
                if message.payload == b"offline":
                    break


def test_settings_refuse_a_client_cert_without_its_key() -> None:
    with pytest.raises(ValueError, match="cert_file"):
        MqttSettings(cert_file=Path("/x")).validate()


def test_topics_are_one_scheme() -> None:
    topics = Topics("edgeagent", "lab", "dev-1")
    assert topics.subscriptions == (
        "edgeagent/group/lab/release/+",
        "edgeagent/group/lab/trust",
        "edgeagent/device/dev-1/release",
    )
    assert topics.state == "edgeagent/device/dev-1/state"
    assert aiomqtt.Topic(topics.events).value == "edgeagent/device/dev-1/events"


def test_reconnect_delays_grow_with_jitter_up_to_the_cap() -> None:
    delays = backoff_delays(1.0, 8.0)
    first = [next(delays) for _ in range(8)]
    ceilings = [1, 2, 4, 8, 8, 8, 8, 8]
    assert all(c / 2 <= d <= c for d, c in zip(first, ceilings, strict=True))
    assert len(set(first)) == len(first)  # jittered: a fleet does not reconnect in lock-step
