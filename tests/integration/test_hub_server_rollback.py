"""Rollbacks through the hub server (issue 23): ``POST /api/v1/deployments/{id}/rollback``
re-sent the old release's serial, every device refused it as a replay, the rollback aborted and
the old deployment was still marked ``rolled_back``. Now the server keeps the serial counter per
model in its database: with ``--release-key`` it re-signs the old manifest with a fresh serial
(and a fresh lifetime), devices accept it, the rollback succeeds and the fleet reports the old
version. Without a key it can only relay uploads, so it refuses (409, state unchanged) to send
an envelope whose serial is not above one it already sent.

The fake devices (``devtools.hub_fleet``) do not check serials; the last test runs the agent's
real update client (``devtools.sim_device``: verification, download, install, commit), which
refuses a replayed serial for real."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import timezone
from pathlib import Path

import pytest

from devtools.broker import Broker
from devtools.fleet_scenario import wait_for_fleet
from devtools.hub_fleet import MODEL, Api, fleet, hub_server, make_release, signing_hub
from devtools.release_site import MODEL as TINY
from devtools.release_site import ReleaseSite
from devtools.sim_device import DevicePlan, SimDevice
from devtools.waiting import until
from edgeagent.fleet.manifest import ReleaseManifest, parse_manifest
from edgeagent.fleet.trust import TrustStore
from edgeagent.hardware.profile import load_profiles
from tests.integration.test_hub_server_signing import _trust_with_uploader

pytestmark = [pytest.mark.broker, pytest.mark.timeout(120)]


def _rollback_path(deployment: dict) -> str:
    return f"/api/v1/deployments/{deployment['id']}/rollback"


async def test_a_signed_rollback_gets_fresh_serials_and_the_fleet_reports_the_old_version(
    broker: Broker, tmp_path: Path
) -> None:
    keys = tmp_path / "keys"
    trust = TrustStore.load(_trust_with_uploader(keys))
    settings = broker.settings()
    async with (
        fleet(settings, 4) as devices,
        hub_server(
            f"sqlite:///{tmp_path / 'hub.db'}",
            settings,
            release_keys=(keys / "release.key",),
            trust_file=keys / "fleet-trust.json",
            send_batch=2,
        ) as url,
    ):
        api = Api(url)
        await api.synced()
        first = await api.deploy("2.0.0", stages_pct=[100])
        assert (await api.until(first["id"], "succeeded", "aborted"))["state"] == "succeeded"
        bad = await api.deploy("3.0.0", stages_pct=[50, 100])
        assert (await api.until(bad["id"], "succeeded", "aborted"))["state"] == "succeeded"
        before_rollback = time.time()

        rollback = await api.call(
            "POST", _rollback_path(bad), expect=201, json={"version": "2.0.0"}
        )
        assert rollback["rollback_of"] == bad["id"]
        done = await api.until(rollback["id"], "succeeded", "aborted")
        assert done["state"] == "succeeded", done
        assert done["totals"]["succeeded"] == 4
        old = await api.call("GET", f"/api/v1/deployments/{bad['id']}")
        assert old["state"] == "rolled_back"
        assert [d.version for d in devices] == ["2.0.0"] * 4
        assert await wait_for_fleet(api, 4, 30, model=MODEL, version="2.0.0") == 4

    rows = {row["device_id"]: row for row in done["devices"]}
    sent: list[ReleaseManifest] = []
    for device in devices:
        manifests = [parse_manifest(trust.verify(e, "release")) for e in device.envelopes]
        assert [m.version for m in manifests] == ["2.0.0", "3.0.0", "2.0.0"]
        serials = [m.serial for m in manifests]
        assert serials == sorted(set(serials)), serials  # each above the one before
        last = manifests[-1]
        assert rows[device.topics.device_id]["serial"] == last.serial
        assert last.issued_at.astimezone(timezone.utc).timestamp() >= int(before_rollback)
        sent += manifests[:-1]
    # the rollback's serials are above every serial the server sent before it, to anyone,
    # and above the uploads' own (2.0.0's is 2000001, 3.0.0's 3000001)
    assert min(rows[d]["serial"] for d in rows) > max(m.serial for m in sent) > 3_000_001


async def test_without_a_release_key_an_envelope_devices_would_refuse_is_not_sent(
    broker: Broker, tmp_path: Path
) -> None:
    settings = broker.settings()
    async with (
        fleet(settings, 2) as devices,
        hub_server(f"sqlite:///{tmp_path / 'hub.db'}", settings) as url,
    ):
        api = Api(url)
        await api.synced()
        await api.call("POST", "/api/v1/releases", expect=201, data=make_release("2.0.0"))
        newer = await api.deploy("3.0.0")
        assert (await api.until(newer["id"], "succeeded", "aborted"))["state"] == "succeeded"
        listed = await api.call("GET", "/api/v1/deployments")

        # the server serial check before send: 2.0.0 (serial 2000001) after 3.0.0 (3000001)
        request = {"model": MODEL, "version": "2.0.0", "group": "lab"}
        refused = await api.call("POST", "/api/v1/deployments", expect=409, json=request)
        assert "not above serial 3000001" in refused["error"], refused
        assert "--release-key" in refused["error"]
        # a rollback is that too: refused, and the deployment is left as it was
        refused = await api.call(
            "POST", _rollback_path(newer), expect=409, json={"version": "2.0.0"}
        )
        assert "a rollback needs --release-key" in refused["error"], refused
        assert await api.call("GET", "/api/v1/deployments") == listed
    assert [[m.version for m in d.received] for d in devices] == [["3.0.0"]] * 2


def _profile(name: str = "generic-x86_64"):  # type: ignore[no-untyped-def]
    return next(p for p in load_profiles() if p.name == name)


@pytest.fixture
async def site(tmp_path: Path) -> AsyncIterator[ReleaseSite]:
    """Keys, the tiny package signed by ``hub sign``, its artifacts served by ``hub serve``."""
    instance = ReleaseSite(tmp_path / "site")
    instance.start()
    try:
        yield instance
    finally:
        instance.stop()


async def test_real_update_clients_install_a_rollback_the_server_re_signed(
    broker: Broker, tmp_path: Path, site: ReleaseSite
) -> None:
    settings = broker.settings()
    envelopes = {version: site.sign(version) for version in ("1.0.0", "2.0.0")}
    devices = [
        SimDevice(
            DevicePlan(f"real-{i}", "lab", "generic-x86_64"),
            _profile(),
            settings,
            site.trust_file,
            tmp_path / f"device-{i}",
        )
        for i in range(2)
    ]
    for device in devices:
        await device.start()
    try:
        await asyncio.gather(*(d.service.link.connected.wait() for d in devices))
        async with signing_hub(
            f"sqlite:///{tmp_path / 'hub.db'}", settings, site.release_key, site.trust_file
        ) as api:
            assert await wait_for_fleet(api, 2, 30, group="lab") == 2
            for version, envelope in envelopes.items():
                await api.call("POST", "/api/v1/releases", expect=201, data=envelope)
                created = await api.call(
                    "POST",
                    "/api/v1/deployments",
                    expect=201,
                    json={"model": TINY, "version": version, "group": "lab"},
                )
                done = await api.until(created["id"], "succeeded", "aborted")
                assert done["state"] == "succeeded", done
            assert [d.serving(TINY) for d in devices] == ["2.0.0"] * 2

            rollback = await api.call(
                "POST", _rollback_path(done), expect=201, json={"version": "1.0.0"}
            )
            back = await api.until(rollback["id"], "succeeded", "aborted")
            assert back["state"] == "succeeded", back  # a replayed serial would be refused
            assert [d["code"] for d in back["devices"]] == ["committed"] * 2
            await until(lambda: all(d.serving(TINY) == "1.0.0" for d in devices))
            assert await wait_for_fleet(api, 2, 30, model=TINY, version="1.0.0") == 2
            old = await api.call("GET", f"/api/v1/deployments/{done['id']}")
            assert old["state"] == "rolled_back"
    finally:
        for device in devices:
            await device.stop()
