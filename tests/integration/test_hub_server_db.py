"""The hub database on SQLite and a real PostgreSQL: migrations build exactly ``schema.py``,
upgrading twice is harmless, SQLite runs in WAL mode, and the history's retention deletes only
what is older than the cut-off."""

from __future__ import annotations

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from edgeagent.hub.server import fleetdb
from edgeagent.hub.server.database import head_revision, open_engine, upgrade
from edgeagent.hub.server.schema import events, metadata
from tests.support.postgres import database_url_fixture, postgres_fixture  # noqa: F401


def _schema_difference(connection: sa.Connection) -> list:
    return compare_metadata(MigrationContext.configure(connection), metadata)


async def test_migrations_build_the_schema_and_are_idempotent(database_url: str) -> None:
    engine = open_engine(database_url)
    try:
        await upgrade(engine)
        await upgrade(engine)  # a second start on the same database changes nothing
        async with engine.connect() as connection:
            assert await connection.run_sync(_schema_difference) == []
            revision = await connection.scalar(sa.text("SELECT version_num FROM alembic_version"))
            assert revision == head_revision() == "0008"
            if engine.dialect.name == "sqlite":
                mode = await connection.scalar(sa.text("PRAGMA journal_mode"))
                assert mode == "wal"
    finally:
        await engine.dispose()


async def test_retention_deletes_only_older_history(database_url: str) -> None:
    engine = open_engine(database_url)
    try:
        await upgrade(engine)
        async with engine.begin() as connection:
            rows = [
                {"device_id": "dev-1", "kind": "state", "at": at}
                for at in (100.0, 200.0, 300.0, 400.0)
            ]
            await fleetdb.append_events(connection, rows)
            assert await fleetdb.prune_events(connection, older_than=250.0) == 2
        async with engine.connect() as connection:
            left = await connection.execute(sa.select(events.c.at).order_by(events.c.at))
            assert [row[0] for row in left] == [300.0, 400.0]
    finally:
        await engine.dispose()
