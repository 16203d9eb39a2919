"""Issue 27, end to end: the hub server deploys an agent release to a real self-updating agent
(this repository's wheel at two versions, A/B root, systemd-like supervisor, from
tests/integration/test_selfupdate.py), and the outcome the *new* agent reports after its
restart completes the deployment. One switch: the rollbacks are test_selfupdate's, and the
hub's side of a rolled-back device is test_hub_server_agent's."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.broker import Broker
from devtools.hub_fleet import Api, hub_server
from edgeagent.fleet.agent_manifest import this_platform
from tests.integration.test_selfupdate import (  # noqa: F401 (site_dir: a fixture)
    BASE,
    DEVICE,
    Device,
    _build_wheel,
    site_dir,
)

pytestmark = [pytest.mark.broker, pytest.mark.timeout(240)]
NEW = "0.2.0"


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The agent's wheel at the two versions of the switch (about a second each)."""
    work = tmp_path_factory.mktemp("agent-wheels")
    return {version: _build_wheel(version, work) for version in (BASE, NEW)}


@pytest.fixture
def device(tmp_path: Path, broker: Broker, site_dir: Path, wheels) -> Iterator[Device]:  # noqa: F811
    instance = Device(tmp_path, broker, site_dir, wheels)
    instance.write_config()
    instance.init()
    yield instance
    instance.stop()


async def test_the_hub_server_switches_a_real_agent_and_counts_its_report(
    device: Device, broker: Broker, tmp_path: Path
) -> None:
    async with hub_server(  # with a release key: the agent's envelope must still be relayed
        f"sqlite:///{tmp_path / 'hub.db'}",
        broker.settings(),
        release_keys=(device.hub / "release.key",),
        trust_file=device.hub / "trust.json",
    ) as url:
        api = Api(url)
        await asyncio.to_thread(device.run)  # serving BASE, its state report on the broker
        # The availability message can make the device known before its state report says
        # which platform it runs, and an agent release targets by platform: wait for that.
        await api.long_poll(
            "/api/v1/devices",
            lambda page: (
                [(d["device_id"], d["platform"]) for d in page["devices"]]
                == [(DEVICE, this_platform())]
            ),
        )
        envelope = device.sign(NEW)
        await api.call("POST", "/api/v1/releases", expect=201, data=envelope)
        created = await api.call(
            "POST",
            "/api/v1/deployments",
            expect=201,
            json={"model": "edgeagent", "version": NEW, "group": "lab"},
        )
        done = await api.until(created["id"], "succeeded", "aborted")
        assert done["state"] == "succeeded", done
        (row,) = done["devices"]
        assert (row["status"], row["code"]) == ("succeeded", "committed"), row
        assert row["envelope_sha256"] == hashlib.sha256(envelope).hexdigest()  # not re-signed
        await asyncio.to_thread(device.wait_serving, NEW)
        shown = await api.call("GET", f"/api/v1/devices/{DEVICE}")
        assert (shown["platform"], shown["agent_version"]) == (this_platform(), NEW)
