"""The database connection: one async engine for SQLite or PostgreSQL, migrated on start.

SQLite runs in WAL mode (readers — the REST API — never wait for the ingest writer) with a busy
time-out and foreign keys on; PostgreSQL needs nothing special. ``upgrade`` applies the
shipped Alembic migrations, so starting a newer hub on an older database just works.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, event
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from edgeagent.hub.server.settings import normalise_database_url

MIGRATIONS = Path(__file__).with_name("migrations")


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")  # durable across a process crash in WAL mode
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=10000")
    cursor.close()


def open_engine(url: str, *, idle_in_transaction_s: float | None = None) -> AsyncEngine:
    """An engine for ``url`` (plain ``sqlite:///`` / ``postgresql://`` spellings accepted).

    ``idle_in_transaction_s`` (PostgreSQL): the server ends a session that sits that long
    inside a transaction — a replica paused mid-transaction (SIGSTOP) then stops holding the
    locks, the lease's share lock included, that a takeover waits for."""
    url = normalise_database_url(url)
    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        if parsed.database and parsed.database != ":memory:":
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        engine = create_async_engine(url)
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
        return engine
    server_settings = {}
    if idle_in_transaction_s is not None:
        ms = max(1, int(idle_in_transaction_s * 1000))
        server_settings["idle_in_transaction_session_timeout"] = str(ms)
    return create_async_engine(
        url,
        pool_size=5,
        max_overflow=5,
        pool_pre_ping=True,
        connect_args={"server_settings": server_settings},
    )


def _alembic_config(connection: Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    return config


def _upgrade(connection: Connection) -> None:
    command.upgrade(_alembic_config(connection), "head")


MIGRATION_LOCK = 0x6564676568756201  # PostgreSQL advisory lock: one replica migrates at a time


async def upgrade(engine: AsyncEngine) -> None:
    """Bring the schema to the newest shipped revision (a no-op when it is there already).

    Replicas started together on one PostgreSQL database migrate one after the other (an
    advisory lock held by the migration's transaction): the next finds the schema current."""
    async with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            await connection.execute(sa.select(sa.func.pg_advisory_xact_lock(MIGRATION_LOCK)))
        await connection.run_sync(_upgrade)


def head_revision() -> str:
    """The newest revision shipped with this package (what ``upgrade`` brings a database to)."""
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_alembic_config()).get_current_head()
    return head or ""
