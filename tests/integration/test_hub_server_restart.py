"""A deployment survives the hub: SIGKILL the server mid-stage, start it again, it finishes.

The devices of stage 1 answer while the hub is dead; those answers wait in the hub's persistent
MQTT session, and the new process resumes from the database rows — no device is sent the
release twice, every device ends up with it, and the deployment succeeds.
"""

from __future__ import annotations

import asyncio
import signal

import pytest

from devtools.broker import Broker
from devtools.hub_fleet import Api, HubProcess, fleet
from tests.support.postgres import database_url_fixture, postgres_fixture  # noqa: F401

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.timeout(120)]


async def test_sigkill_mid_stage_then_restart_finishes_the_deployment(
    broker: Broker, database_url: str
) -> None:
    settings = broker.settings()
    hold = asyncio.Event()
    async with fleet(settings, 4, hold=hold) as devices:
        hub = HubProcess(database_url, settings)
        api = Api(await hub.start())
        await api.synced()
        created = await api.deploy("2.0.0", stages_pct=[50, 100])
        first, second = devices[:2], devices[2:]
        await asyncio.gather(*(d.got_release.wait() for d in first))
        running = await api.call("GET", f"/api/v1/deployments/{created['id']}")
        while running["totals"]["sent"] < 2:  # the hub recorded what it sent
            running = await api.call(
                "GET", f"/api/v1/deployments/{created['id']}?wait=30&after={running['version']}"
            )
        assert (running["state"], running["stage"]) == ("running", 1)

        assert hub.stop(signal.SIGKILL) == -signal.SIGKILL
        hold.set()  # stage 1 answers while no hub is running
        await asyncio.gather(*(d.answered.wait() for d in first))
        assert not any(d.received for d in second)

        api = Api(await hub.start())
        done = await api.until(created["id"], "succeeded", "aborted")
        assert done["state"] == "succeeded", done
        assert done["totals"]["succeeded"] == 4
        assert [len(d.received) for d in devices] == [1, 1, 1, 1]  # nobody got it twice
        assert hub.stop(signal.SIGTERM) == 0  # and a graceful stop is clean
