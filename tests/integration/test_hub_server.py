"""The hub server against a real Mosquitto and a real database (SQLite file and PostgreSQL):
ingest of retained and live reports, hostile messages, the REST API, staged deployments."""

from __future__ import annotations

import json

import aiomqtt
import pytest

from devtools.broker import Broker
from devtools.hub_fleet import Api, fleet, hub_server, make_release
from edgeagent.fleet.mqtt import client_options
from tests.support.postgres import database_url_fixture, postgres_fixture  # noqa: F401

pytestmark = [pytest.mark.broker, pytest.mark.timeout(120)]

HOSTILE = [
    ("edgeagent/device/bad-json/state", b"{not json", True),
    ("edgeagent/device/a-list/state", b"[1, 2, 3]", True),
    ("edgeagent/device/huge/state", b'{"x": "' + b"A" * 70_000 + b'"}', True),
    ("edgeagent/device/odd-types/state", json.dumps({"models": [1], "governor": 7}).encode(), True),
    ("edgeagent/device/bad$id/state", b"{}", True),
    ("edgeagent/device/weird/availability", b"maybe", True),
    ("edgeagent/device/weird/events", b'{"no": "step"}', False),
]


async def _publish_hostile(broker: Broker) -> None:
    async with aiomqtt.Client(**client_options(broker.settings(), "hostile")) as client:
        for topic, payload, retain in HOSTILE:
            await client.publish(topic, payload, qos=1, retain=retain)


async def test_retained_fleet_is_read_completely_and_hostile_reports_are_skipped(
    broker: Broker, database_url: str
) -> None:
    settings = broker.settings()
    await _publish_hostile(broker)
    async with fleet(settings, 12, group="lab") as devices:
        other = devices[:3]
        for device in other:  # three of them run version 1.1.0
            device.version = "1.1.0"
            await device.report()
        async with hub_server(database_url, settings) as url:
            api = Api(url)
            health = await api.synced()
            # 12 real devices; every hostile report was skipped, "odd-types" (a valid object,
            # wrong field types) too: the contract refuses a wrong type naming it (issue 22).
            assert health["retained_devices"] == 12
            assert health["ingest"]["skipped"] == 6

            page = await api.call("GET", "/api/v1/devices?group=lab&limit=5&offset=10")
            assert page["total"] == 12 and page["counts"] == {"online": 12}
            assert [d["device_id"] for d in page["devices"]] == ["dev-010", "dev-011"]
            assert page["synced"] is True

            newer = await api.call("GET", "/api/v1/devices?model=mobilenet_v2&version=1.1.0")
            assert sorted(d["device_id"] for d in newer["devices"]) == [
                d.topics.device_id for d in other
            ]
            device = await api.call("GET", "/api/v1/devices/dev-005")
            assert device["models"] == {"mobilenet_v2": "1.0.0"}
            assert device["backends"]["mobilenet_v2"]["precision"] == "int8"
            assert device["board"] == "Test Board 4"
            assert device["profile"] == "generic-x86_64"
            assert (device["governor_state"], device["max_temp_c"]) == ("normal", 51.5)
            assert device["power_w"] == 4.25

            await api.call("GET", "/api/v1/devices/odd-types", expect=404)

            history = await api.call("GET", "/api/v1/devices/dev-005/history")
            kinds = {(e["kind"], e["step"]) for e in history["events"]}
            assert kinds == {("state", ""), ("availability", "online")}
            await api.call("GET", "/api/v1/devices/nobody", expect=404)
            await api.call("GET", "/api/v1/devices?limit=0", expect=400)
            await api.call("GET", "/api/v1/devices?version=1.0.0", expect=400)

            # a device going away live reaches the table
            went = devices[0]
            await went.stop()
            offline = await api.long_poll(
                f"/api/v1/devices/{went.topics.device_id}",
                lambda found: found["availability"] == "offline",
            )
            assert offline["online"] is False


async def test_staged_rollout_succeeds_stage_by_stage(broker: Broker, database_url: str) -> None:
    settings = broker.settings()
    async with fleet(settings, 10) as devices, hub_server(database_url, settings) as url:
        api = Api(url)
        await api.synced()
        envelope = make_release("2.0.0")
        release = await api.call("POST", "/api/v1/releases", expect=201, data=envelope)
        again = await api.call("POST", "/api/v1/releases", expect=200, data=envelope)
        assert again == release  # the same bytes are stored once
        created = await api.call(
            "POST",
            "/api/v1/deployments",
            expect=201,
            json={"release_id": release["id"], "group": "lab", "stages_pct": [10, 50, 100]},
        )
        assert [s["devices"] for s in created["stages"]] == [1, 4, 5]
        done = await api.until(created["id"], "succeeded", "aborted")
        assert done["state"] == "succeeded", done
        assert done["totals"]["succeeded"] == 10
        assert all(d.received[-1].version == "2.0.0" for d in devices)
        newer = "/api/v1/devices?model=mobilenet_v2&version=2.0.0"
        table = await api.call("GET", newer)
        while table["total"] < 10:  # each device's new state report follows its outcome
            table = await api.call("GET", f"{newer}&wait=30&after={table['version']}")
        history = await api.call("GET", "/api/v1/devices/dev-000/history?kind=event")
        assert history["events"][0]["result"] == "succeeded"


async def test_failures_in_stage_one_abort_before_stage_two(
    broker: Broker, database_url: str
) -> None:
    settings = broker.settings()
    async with (
        fleet(settings, 10, failing=3) as devices,
        hub_server(database_url, settings) as url,
    ):
        api = Api(url)
        await api.synced()
        created = await api.deploy("2.0.0", stages_pct=[30, 100], abort_threshold_pct=30)
        done = await api.until(created["id"], "succeeded", "aborted")
        assert done["state"] == "aborted"
        assert "3 of 3 devices failed" in done["reason"]
        # stage 2 was never sent, and never will be: not "queued" (issue 23)
        assert (done["totals"]["queued"], done["totals"]["not_sent"]) == (0, 7)
        assert all(not d.received for d in devices[3:])
        codes = {d["device_id"]: d["code"] for d in done["devices"] if d["stage"] == 1}
        assert codes == {f"dev-{i:03d}": "health_check" for i in range(3)}


async def test_more_retained_reports_than_the_broker_queues_are_all_read(
    broker: Broker, tmp_path
) -> None:
    """Mosquitto queues at most ``max_queued_messages`` (1000 here, its default) QoS 1
    messages per client and drops the rest; a subscription's retained reports arrive all at
    once, so the hub must read them in a way that loses none, and count them."""
    settings = broker.settings()
    count = 1100
    state = json.dumps({"group": "big", "updated_at": 1.0}).encode()
    async with aiomqtt.Client(**client_options(settings, "many")) as client:
        for i in range(count):  # the last one acknowledged: the broker has handled them all
            topic = f"edgeagent/device/big-{i:04d}/state"
            await client.publish(topic, state, qos=1 if i == count - 1 else 0, retain=True)
    async with hub_server(f"sqlite:///{tmp_path / 'hub.db'}", settings) as url:
        api = Api(url)
        health = await api.synced()
        assert health["retained_devices"] == count
        page = await api.call("GET", "/api/v1/devices?group=big&limit=1")
        assert page["total"] == count


async def test_silent_devices_time_out_and_abort_the_deployment(
    broker: Broker, database_url: str
) -> None:
    """The in-progress time-out is in the database: a stage whose devices never answer ends
    when it expires, the silent devices count as failed, and the abort criteria apply."""
    settings = broker.settings()
    async with (
        fleet(settings, 4, answer="silent") as devices,
        hub_server(database_url, settings) as url,
    ):
        api = Api(url)
        await api.synced()
        created = await api.deploy("2.0.0", stages_pct=[50, 100], stage_timeout_s=0.5)
        done = await api.until(created["id"], "succeeded", "aborted")
        assert done["state"] == "aborted"
        first = [d for d in done["devices"] if d["stage"] == 1]
        assert [(d["status"], d["code"]) for d in first] == [("timed_out", "timed_out")] * 2
        assert not any(d.received for d in devices[2:])


async def test_an_outcome_event_lost_on_the_way_is_read_from_the_state_report(
    broker: Broker, database_url: str
) -> None:
    """A broker drops QoS 1 messages beyond its queue limit (a whole fleet answering at once);
    the device's retained state repeats its last outcome, and that is enough."""
    settings = broker.settings()
    async with (
        fleet(settings, 3, lose_events=True) as devices,
        hub_server(database_url, settings) as url,
    ):
        api = Api(url)
        await api.synced()
        created = await api.deploy("2.0.0")
        done = await api.until(created["id"], "succeeded", "aborted")
        assert done["state"] == "succeeded"
        assert [d["code"] for d in done["devices"]] == ["installed"] * 3
        assert all(d.version == "2.0.0" for d in devices)
