"""Issue 23: on PostgreSQL the controller's mark-sent UPDATE of a send batch deadlocked with the
ingest's outcome writes (each locked the same ``deployment_devices`` rows in its own order),
and the retried pass sent the release a second time to devices it had already reached (9 of
300). Now both lock those rows in one order (by device id), so a fleet answering while the
controller is still sending (small send batches, many commits interleaved with the answers)
runs without a deadlock, and every device gets the release exactly once."""

from __future__ import annotations

import asyncio
import logging

import pytest

from devtools.broker import Broker
from devtools.hub_fleet import Api, FakeDevice, fleet, hub_server
from tests.support.postgres import Postgres, postgres_fixture  # noqa: F401

pytestmark = [pytest.mark.broker, pytest.mark.timeout(120)]

DEVICES = 300
BATCH = 10  # --send-batch: 30 batches, each marked sent while its devices answer
WRITERS = ("edgeagent.hub.server.controller", "edgeagent.hub.server.ingest")


async def _answer_backwards(batch: list[FakeDevice]) -> None:
    """Once the last device of a send batch has the release (the controller is about to mark
    the batch sent), let them all answer at once, last device first: the ingest then writes
    their rows against the order the controller locks them in, while it locks them."""
    await batch[len(batch) // 2].got_release.wait()
    for device in reversed(batch):
        assert device.hold is not None
        device.hold.set()


@pytest.fixture
def database_url(postgres: Postgres) -> str:
    """PostgreSQL only: SQLite has one writer at a time, so nothing there can deadlock."""
    return postgres.create_database()


async def test_a_fleet_answering_while_the_controller_sends_never_deadlocks(
    broker: Broker, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="edgeagent.hub.server")
    settings = broker.settings()
    async with (
        fleet(settings, DEVICES) as devices,
        hub_server(database_url, settings, send_batch=BATCH) as url,
    ):
        for device in devices:
            device.hold = asyncio.Event()
        batches = [devices[i : i + BATCH] for i in range(0, DEVICES, BATCH)]
        answering = [asyncio.create_task(_answer_backwards(batch)) for batch in batches]
        api = Api(url)
        await api.synced()
        created = await api.deploy("2.0.0", stages_pct=[100])
        done = await api.until(created["id"], "succeeded", "aborted")
        await asyncio.gather(*answering)
    problems = [
        record.getMessage()
        for record in caplog.records
        if record.name in WRITERS and record.levelno >= logging.WARNING
    ]
    assert problems == []  # no failed pass, no batch retried one by one: no deadlock
    assert "deadlock" not in caplog.text.lower()
    assert done["state"] == "succeeded", done
    assert done["totals"]["succeeded"] == DEVICES
    assert [len(d.envelopes) for d in devices] == [1] * DEVICES  # nobody got it twice
