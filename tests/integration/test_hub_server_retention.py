"""The retention sweep is a background job of the hub server: a sweep the database refuses must
be logged and retried, not end the server (a background job that raises stops ``serve``; the
CI run of issue 22's stop hung two minutes on a hub that had died this way mid-test)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import sqlalchemy as sa

from devtools.broker import Broker
from devtools.hub_fleet import Api, hub_server
from devtools.waiting import until
from edgeagent.hub.server import fleetdb
from edgeagent.hub.server.database import open_engine, upgrade

pytestmark = [pytest.mark.broker, pytest.mark.timeout(120)]


async def _database_refusing_deletes(path: Path) -> str:
    """A hub database holding one expired event that SQLite refuses to delete."""
    url = f"sqlite:///{path}"
    engine = open_engine(url)
    try:
        await upgrade(engine)
        async with engine.begin() as connection:
            await fleetdb.append_events(connection, [{"device_id": "d", "kind": "state", "at": 1}])
            await connection.execute(
                sa.text(
                    "CREATE TRIGGER keep_events BEFORE DELETE ON events "
                    "BEGIN SELECT RAISE(ABORT, 'events are kept'); END"
                )
            )
    finally:
        await engine.dispose()
    return url


async def test_a_refused_sweep_is_retried_and_the_server_keeps_serving(
    broker: Broker, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = await _database_refusing_deletes(tmp_path / "hub.db")
    caplog.set_level(logging.WARNING, logger="edgeagent.hub.server.service")

    def refused_sweeps() -> int:
        return sum("retention sweep failed" in r.getMessage() for r in caplog.records)

    async with hub_server(url, broker.settings(), prune_interval_s=0.05) as hub:
        await until(lambda: refused_sweeps() >= 2, 30, what="two refused retention sweeps")
        health = await Api(hub).synced()
        assert health["synced"]
    assert "events are kept" in next(
        r.getMessage() for r in caplog.records if "retention sweep failed" in r.getMessage()
    )
