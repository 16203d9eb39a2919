"""The samples table: store a device's upload once, list and review them, read for export.

Only this module writes sample rows. A row is inserted after its image file is in place, in
one statement guarded by the (device, sample id) unique key, so two uploads of the same
sample racing each other still leave one row.
"""

from __future__ import annotations

import time
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncConnection

from edgeagent.fleet.samples import SampleRecord, record_json
from edgeagent.hub.server.schema import samples

STATUSES = ("new", "accepted", "corrected", "rejected")
REVIEWED = ("accepted", "corrected")
STORED, DUPLICATE, CONFLICT = "stored", "duplicate", "conflict"


async def existing(connection: AsyncConnection, device_id: str, sample_id: str) -> str | None:
    """The stored image's SHA-256 of this device's sample, None when it has none."""
    row = (
        await connection.execute(
            sa.select(samples.c.sha256).where(
                samples.c.device_id == device_id, samples.c.sample_id == sample_id
            )
        )
    ).first()
    return None if row is None else str(row.sha256)


async def insert(
    connection: AsyncConnection, record: SampleRecord, sha256: str, size: int, blob: str
) -> str:
    """STORED, or DUPLICATE (the same image already stored), or CONFLICT (another image under
    this id) — the last two write nothing."""
    outputs = record_json(record)["outputs"]
    try:
        async with connection.begin_nested():
            await connection.execute(
                samples.insert().values(
                    device_id=record.device_id,
                    sample_id=record.id,
                    model=record.model,
                    version=record.version,
                    variant=record.variant,
                    task=record.task,
                    captured_at=record.captured_at,
                    received_at=time.time(),
                    width=record.width,
                    height=record.height,
                    sha256=sha256,
                    size=size,
                    blob=blob,
                    outputs=outputs,
                )
            )
    except IntegrityError:
        have = await existing(connection, record.device_id, record.id)
        return DUPLICATE if have == sha256 else CONFLICT
    return STORED


def _row(row: Any) -> dict[str, Any]:
    data = dict(row._mapping)
    return data


async def listing(
    connection: AsyncConnection,
    *,
    model: str | None = None,
    version: str | None = None,
    status: str | None = None,
    limit: int = 100,
    offset: int = 0,
) -> list[dict[str, Any]]:
    query = sa.select(samples).order_by(samples.c.id)
    if model:
        query = query.where(samples.c.model == model)
    if version:
        query = query.where(samples.c.version == version)
    if status:
        query = query.where(samples.c.status == status)
    rows = await connection.execute(query.limit(limit).offset(offset))
    return [_row(r) for r in rows]


async def one(connection: AsyncConnection, row_id: int) -> dict[str, Any] | None:
    row = (await connection.execute(sa.select(samples).where(samples.c.id == row_id))).first()
    return None if row is None else _row(row)


async def summary(connection: AsyncConnection) -> list[dict[str, Any]]:
    """Sample counts per model, version and review status (the review page's index)."""
    query = (
        sa.select(samples.c.model, samples.c.version, samples.c.status, sa.func.count())
        .group_by(samples.c.model, samples.c.version, samples.c.status)
        .order_by(samples.c.model, samples.c.version)
    )
    return [
        {"model": m, "version": v, "status": s, "count": int(c)}
        for m, v, s, c in await connection.execute(query)
    ]


async def review(
    connection: AsyncConnection, row_id: int, status: str, annotation: dict[str, Any] | None
) -> bool:
    """Record a person's verdict; False when there is no such sample."""
    if status not in STATUSES:
        raise ValueError(f"status must be one of {', '.join(STATUSES)}")
    done = await connection.execute(
        samples.update()
        .where(samples.c.id == row_id)
        .values(status=status, annotation=annotation, reviewed_at=time.time())
    )
    return bool(done.rowcount)
