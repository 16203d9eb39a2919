"""An aborted deployment never installs on a device that was offline during the abort.

The hub server sends each device its release through the device's persistent MQTT session, so
a device that is offline when its stage is sent gets it when it comes back — even after the
deployment was aborted, which used to install the aborted release and leave the deployment
saying ``timed_out``. Now the abort clears the group's retained slot if it holds the release
and sends a signed cancellation behind the release; the device refuses the release
(``cancelled``) and the hub records that answer. Real Mosquitto, the agent's real update
client (``devtools.sim_device``) for the device that was offline, fake devices elsewhere."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from devtools.broker import Broker
from devtools.hub_fleet import MODEL, Api, fleet, hub_server, make_release, signing_hub
from devtools.release_site import MODEL as TINY
from devtools.release_site import ReleaseSite
from devtools.sim_device import DevicePlan, SimDevice
from edgeagent.fleet.cancel import parse_cancellation
from edgeagent.fleet.manifest import ReleaseManifest, parse_manifest
from edgeagent.fleet.settings import MqttSettings
from edgeagent.fleet.topics import GroupTopics
from edgeagent.fleet.trust import TrustStore
from edgeagent.hub.publish import ReleaseSlot, _retained, clear_release_of, hub_client, publish
from tests.integration.test_hub_server_rollback import _profile
from tests.integration.test_hub_server_rollback import site as site
from tests.integration.test_hub_server_signing import _trust_with_uploader
from tests.support.postgres import database_url_fixture, postgres_fixture  # noqa: F401

pytestmark = [pytest.mark.broker, pytest.mark.timeout(180)]


def _abort_path(deployment: dict[str, Any]) -> str:
    return f"/api/v1/deployments/{deployment['id']}/abort"


def _row(deployment: dict[str, Any], device_id: str) -> dict[str, Any]:
    return next(d for d in deployment["devices"] if d["device_id"] == device_id)


async def _slot_holds(settings: MqttSettings, model: str) -> bytes | None:
    """What the group's retained slot of ``model`` holds (None: nothing), read as devices do."""
    slot = GroupTopics(settings.topic_prefix, "lab").release(model)
    async with hub_client(settings, "test") as client:
        return await _retained(client, slot, settings)


async def _fill_slot(settings: MqttSettings, envelope: bytes, model: str = MODEL) -> None:
    slot = GroupTopics(settings.topic_prefix, "lab").release(model)
    await publish(settings, [ReleaseSlot(slot.name, slot.retained, model)], envelope)


async def test_a_device_offline_during_the_abort_does_not_install_the_release(
    broker: Broker, tmp_path: Path, site: ReleaseSite, database_url: str
) -> None:
    settings = broker.settings()
    profile = _profile()

    def device(name: str) -> SimDevice:
        plan = DevicePlan(name, "lab", profile.name)
        return SimDevice(plan, profile, settings, site.trust_file, tmp_path / name)

    online, offline = device("real-0"), device("real-1")
    for sim in (online, offline):
        await sim.start()
    returned: SimDevice | None = None
    try:
        await asyncio.gather(*(sim.service.link.connected.wait() for sim in (online, offline)))
        async with signing_hub(database_url, settings, site.release_key, site.trust_file) as api:
            for version in ("1.0.0", "2.0.0"):
                await api.call("POST", "/api/v1/releases", expect=201, data=site.sign(version))
            first = await api.call(
                "POST",
                "/api/v1/deployments",
                expect=201,
                json={"model": TINY, "version": "1.0.0", "group": "lab"},
            )
            assert (await api.until(first["id"], "succeeded", "aborted"))["state"] == "succeeded"

            await offline.stop()  # its client stops; the broker keeps its session
            created = await api.call(
                "POST",
                "/api/v1/deployments",
                expect=201,
                json={
                    "model": TINY,
                    "version": "2.0.0",
                    "group": "lab",
                    "stages_pct": [100],
                    "stage_timeout_s": 3600,
                },
            )
            path = f"/api/v1/deployments/{created['id']}"
            waiting = await api.long_poll(
                path,
                lambda d: (
                    _row(d, "real-0")["status"] == "succeeded"
                    and _row(d, "real-1")["status"] == "sent"
                ),
            )
            sent_serial = _row(waiting, "real-1")["serial"]
            await api.call("POST", _abort_path(created), json={"reason": "bad numbers"})
            aborted = await api.long_poll(path, lambda d: d["cancelled_at"] is not None)
            assert aborted["state"] == "aborted"
            assert _row(aborted, "real-1")["status"] == "sent"  # it has not answered yet

            returned = device("real-1")  # the same id and state directory: the same session
            await returned.start()
            done = await api.long_poll(path, lambda d: _row(d, "real-1")["status"] != "sent")
            row = _row(done, "real-1")
            assert (row["status"], row["result"], row["code"]) == (
                "cancelled",
                "refused",
                "cancelled",
            ), row
            assert "bad numbers" in row["message"]
            assert row["serial"] == sent_serial
            assert done["totals"]["cancelled"] == 1 and done["state"] == "aborted"

        store = returned.service.store
        assert store.current(TINY) == "1.0.0"
        assert "2.0.0" not in store.versions(TINY)
        assert returned.ended["2.0.0"][1] == "refused"
        assert online.serving(TINY) == "2.0.0"  # it took it before the abort
    finally:
        for sim in (online, returned or offline):
            await sim.stop()


async def test_an_abort_by_the_policy_cancels_and_clears_the_retained_slot(
    broker: Broker, tmp_path: Path, database_url: str
) -> None:
    """A silent device times out and aborts the deployment; the group's slot held the same
    release (``hub publish``): it is empty afterwards, and the silent device was sent a
    cancellation the release key signed, covering the serial it was sent."""
    keys = tmp_path / "keys"
    trust = TrustStore.load(_trust_with_uploader(keys))
    settings = broker.settings()
    envelope = make_release("2.0.0")
    await _fill_slot(settings, envelope)
    async with (
        fleet(settings, 1, answer="silent", name="quiet") as (quiet,),
        signing_hub(database_url, settings, keys / "release.key", keys / "fleet-trust.json") as api,
    ):
        created = await api.deploy("2.0.0", stages_pct=[100], stage_timeout_s=1)
        path = f"/api/v1/deployments/{created['id']}"
        done = await api.long_poll(path, lambda d: d["cancelled_at"] is not None)
        assert done["state"] == "aborted"
        assert _row(done, "quiet-000")["status"] == "timed_out"
        assert await _slot_holds(settings, MODEL) is None
        await asyncio.wait_for(quiet.got_cancellation.wait(), 30)

    (sent,) = [parse_manifest(trust.verify(e, "release")) for e in quiet.envelopes]
    (cancel,) = [parse_cancellation(trust.verify(e, "release")) for e in quiet.cancellations]
    assert isinstance(sent, ReleaseManifest)
    assert (cancel.model, cancel.deployment_id) == (sent.model, sent.deployment_id)
    assert cancel.serial == sent.serial and cancel.expires == sent.expires


async def test_without_a_release_key_the_slot_is_cleared_and_no_cancellation_sent(
    broker: Broker, tmp_path: Path
) -> None:
    settings = broker.settings()
    await _fill_slot(settings, make_release("2.0.0"))
    async with (
        fleet(settings, 1, answer="silent", name="quiet") as (quiet,),
        hub_server(f"sqlite:///{tmp_path / 'hub.db'}", settings) as url,
    ):
        api = Api(url)
        await api.synced()
        created = await api.deploy("2.0.0", stages_pct=[100], stage_timeout_s=1)
        done = await api.long_poll(
            f"/api/v1/deployments/{created['id']}", lambda d: d["cancelled_at"] is not None
        )
        assert done["state"] == "aborted"
        assert await _slot_holds(settings, MODEL) is None
    assert quiet.cancellations == [] and len(quiet.envelopes) == 1


async def test_a_slot_holding_another_release_is_left_alone(broker: Broker) -> None:
    settings = broker.settings()
    current = make_release("1.0.0")
    await _fill_slot(settings, current)
    assert not await clear_release_of(settings, "lab", MODEL, f"{MODEL}-2.0.0-test")
    assert await _slot_holds(settings, MODEL) == current
    assert await clear_release_of(settings, "lab", MODEL, f"{MODEL}-1.0.0-test")
    assert await _slot_holds(settings, MODEL) is None
