"""Fleet queries: store what devices report, read the fleet table, a device and its history.

Writes come from the ingest loop in batches (one transaction, and one statement per table, for
many messages); reads come from the REST API. Upserts use each database's own ``ON CONFLICT``,
so a device's row is written in one statement on SQLite and PostgreSQL alike.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from edgeagent.hub.server.schema import devices, events

EMPTY_DEVICE: dict[str, Any] = {"models": {}, "backends": {}, "temperatures": {}}
# Every history row carries every column: one INSERT for many rows takes its columns from the
# first row, so a key missing from that one would be silently dropped from all the others.
EMPTY_EVENT: dict[str, Any] = {
    "deployment_id": "",
    "step": "",
    "result": "",
    "code": "",
    "detail": {},
    "report_id": None,
}


async def upsert_devices(connection: AsyncConnection, rows: Sequence[Mapping[str, Any]]) -> None:
    """Create or update devices' rows in one statement; every row has the same columns
    (``device_id`` and the ones to set), and a device appears once."""
    if not rows:
        return
    columns = [c for c in rows[0] if c != "device_id"]
    dialect = sqlite if connection.dialect.name == "sqlite" else postgresql
    statement = dialect.insert(devices)
    newer = None
    if "reported_at" in columns:  # a replica that lags behind another never writes older news
        newer = sa.or_(
            devices.c.reported_at.is_(None),
            statement.excluded.reported_at >= devices.c.reported_at,
        )
    statement = statement.on_conflict_do_update(
        index_elements=["device_id"], set_={c: statement.excluded[c] for c in columns}, where=newer
    )
    await connection.execute(statement, [{**EMPTY_DEVICE, **row} for row in rows])


async def append_events(connection: AsyncConnection, rows: Sequence[Mapping[str, Any]]) -> None:
    """Rows of the append-only history (``kind``: event, state or availability); a row whose
    ``report_id`` is stored already (another replica stored that report) is left out."""
    if rows:
        dialect = sqlite if connection.dialect.name == "sqlite" else postgresql
        statement = dialect.insert(events).on_conflict_do_nothing(index_elements=["report_id"])
        await connection.execute(statement, [{**EMPTY_EVENT, **row} for row in rows])


async def prune_events(connection: AsyncConnection, older_than: float) -> int:
    """Delete history before ``older_than`` (the retention sweep); returns rows deleted."""
    result = await connection.execute(events.delete().where(events.c.at < older_than))
    return result.rowcount or 0


@dataclass(frozen=True)
class DeviceFilter:
    """The fleet table's filters; empty fields match everything."""

    group: str = ""
    model: str = ""
    version: str = ""  # needs ``model``: devices whose active version of it is this
    profile: str = ""
    availability: str = ""  # online | offline | unknown
    governor_state: str = ""

    def clauses(self, dialect: str) -> list[sa.ColumnElement[bool]]:
        where: list[sa.ColumnElement[bool]] = []
        for value, column in (
            (self.group, devices.c.group_name),
            (self.profile, devices.c.profile),
            (self.availability, devices.c.availability),
            (self.governor_state, devices.c.governor_state),
        ):
            if value:
                where.append(column == value)
        if self.model:
            active = _json_text(devices.c.models, self.model, dialect)
            where.append(active == self.version if self.version else active.is_not(None))
        return where


def _json_text(column: sa.Column[Any], key: str, dialect: str) -> sa.ColumnElement[Any]:
    """``column[key]`` as text, spelled the way each database reads a JSON member."""
    if dialect == "sqlite":
        return sa.func.json_extract(column, sa.literal("$." + _json_path_key(key)))
    return column.op("->>")(sa.literal(key))


def _json_path_key(key: str) -> str:
    return '"' + key.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _device_dict(row: sa.Row[Any], now: float) -> dict[str, Any]:
    data = dict(row._mapping)
    data["group"] = data.pop("group_name")
    data["online"] = data["availability"] == "online"
    data["seen_s_ago"] = round(max(0.0, now - data["last_seen"]), 1)
    return data


async def list_devices(
    connection: AsyncConnection, where: DeviceFilter, *, limit: int, offset: int
) -> dict[str, Any]:
    """One page of the fleet table, with the total and per-state counts of the whole match."""
    clauses = where.clauses(connection.dialect.name)
    rows = await connection.execute(
        sa.select(devices).where(*clauses).order_by(devices.c.device_id).limit(limit).offset(offset)
    )
    counts = await connection.execute(
        sa.select(devices.c.availability, sa.func.count())
        .where(*clauses)
        .group_by(devices.c.availability)
    )
    by_availability = {name: number for name, number in counts.all()}
    now = time.time()
    return {
        "total": sum(by_availability.values()),
        "counts": by_availability,
        "limit": limit,
        "offset": offset,
        "devices": [_device_dict(row, now) for row in rows],
    }


async def get_device(connection: AsyncConnection, device_id: str) -> dict[str, Any] | None:
    row = (
        await connection.execute(sa.select(devices).where(devices.c.device_id == device_id))
    ).first()
    return None if row is None else _device_dict(row, time.time())


async def device_history(
    connection: AsyncConnection,
    device_id: str,
    *,
    limit: int,
    before: float | None = None,
    kind: str = "",
    skip_kind: str = "",
) -> list[dict[str, Any]]:
    """The device's history, newest first; ``before`` pages further back; ``kind`` keeps
    rows of one kind, ``skip_kind`` leaves one out (the state samples a page charts)."""
    query = sa.select(events).where(events.c.device_id == device_id)
    if before is not None:
        query = query.where(events.c.at < before)
    if kind:
        query = query.where(events.c.kind == kind)
    if skip_kind:
        query = query.where(events.c.kind != skip_kind)
    rows = await connection.execute(
        query.order_by(events.c.at.desc(), events.c.id.desc()).limit(limit)
    )
    return [dict(row._mapping) for row in rows]


async def fleet_counts(connection: AsyncConnection) -> dict[str, int]:
    rows = await connection.execute(
        sa.select(devices.c.availability, sa.func.count()).group_by(devices.c.availability)
    )
    return {name: number for name, number in rows.all()}
