"""What the API, the dashboard, the controller and the canceller read of deployments; every
write is a named transition in ``deploydb``.

The counts per stage and status are one grouped query, so they cost the same at 10,000 devices
as at ten.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from edgeagent.hub.policy import FINISHED, Tally
from edgeagent.hub.server.deploydb import DEVICE_STATUSES, UNANSWERED
from edgeagent.hub.server.releasedb import get_release, one_row, release_view
from edgeagent.hub.server.schema import deployment_devices, deployments, releases

dd = deployment_devices


async def get_deployment(
    connection: AsyncConnection,
    deployment_id: str,
    *,
    device_limit: int | None = None,
    device_offset: int = 0,
) -> dict[str, Any] | None:
    """The deployment row, its release, progress per stage and the devices' outcomes.

    The counts per stage and status are one grouped query, so they cost the same at 10,000
    devices as at ten; ``device_limit`` pages the device rows (None: all of them), because
    a long poll answering every row on every change was 14 % of the hub's CPU at 10,000.
    """
    row = await one_row(connection, sa.select(deployments).where(deployments.c.id == deployment_id))
    if row is None:
        return None
    release = await get_release(connection, row["release_id"])
    mine = deployment_devices.c.deployment_id == deployment_id
    grouped = await connection.execute(
        sa.select(deployment_devices.c.stage, deployment_devices.c.status, sa.func.count())
        .where(mine)
        .group_by(deployment_devices.c.stage, deployment_devices.c.status)
    )
    counts = {(stage, status): number for stage, status, number in grouped}
    stages: list[dict[str, Any]] = []
    for number in range(1, row["stage_count"] + 1):
        in_stage = {s: counts.get((number, s), 0) for s in DEVICE_STATUSES}
        stages.append({"stage": number, "devices": sum(in_stage.values()), **in_stage})
    totals = {s: sum(stage[s] for stage in stages) for s in DEVICE_STATUSES}
    query = (
        sa.select(deployment_devices)
        .where(mine)
        .order_by(deployment_devices.c.stage, deployment_devices.c.device_id)
        .offset(device_offset)
    )
    if device_limit is not None:
        query = query.limit(device_limit)
    members = await connection.execute(query)
    return {
        **_named(row),
        "release": release_view(release) if release else None,
        "totals": totals,
        "stages": stages,
        "device_count": sum(counts.values()),
        "devices": [{k: v for k, v in r._mapping.items() if k != "deployment_id"} for r in members],
    }


async def list_deployments(
    connection: AsyncConnection, *, state: str = "", limit: int, offset: int
) -> list[dict[str, Any]]:
    query = sa.select(deployments).order_by(deployments.c.created_at.desc())
    if state:
        query = query.where(deployments.c.state == state)
    rows = await connection.execute(query.limit(limit).offset(offset))
    return [_named(dict(r._mapping)) for r in rows]


def _named(row: dict[str, Any]) -> dict[str, Any]:
    """A deployment row with the API's names (``group``, not the column's ``group_name``)."""
    row["group"] = row.pop("group_name")
    return row


async def active_deployments(connection: AsyncConnection) -> list[dict[str, Any]]:
    """The deployments the controller drives (``scheduled``, ``running``), oldest first, each
    with its release's envelope and kind."""
    return await _with_release(
        connection,
        deployments.c.state.in_(("scheduled", "running")),
        deployments.c.created_at,
    )


async def aborted_uncancelled(connection: AsyncConnection) -> list[dict[str, Any]]:
    """The aborted deployments whose cancellation was not sent yet, each with its release's
    envelope and kind."""
    return await _with_release(
        connection,
        sa.and_(deployments.c.state == "aborted", deployments.c.cancelled_at.is_(None)),
        deployments.c.updated_at,
    )


async def _with_release(
    connection: AsyncConnection, where: sa.ColumnElement[bool], order: sa.ColumnElement[Any]
) -> list[dict[str, Any]]:
    rows = await connection.execute(
        sa.select(deployments, releases.c.envelope, releases.c.kind)
        .join(releases, releases.c.id == deployments.c.release_id)
        .where(where)
        .order_by(order)
    )
    return [dict(r._mapping) for r in rows]


async def waiting_count(connection: AsyncConnection, deployment: dict[str, Any]) -> int:
    """Devices of the current stage the deployment still waits for (queued or sent)."""
    value = await connection.scalar(
        sa.select(sa.func.count()).where(
            dd.c.deployment_id == deployment["id"],
            dd.c.stage == deployment["stage"],
            dd.c.status.in_(("queued", "sent")),
        )
    )
    return int(value or 0)


async def tally(connection: AsyncConnection, deployment: dict[str, Any]) -> Tally:
    """The finished devices of every stage up to the current one, by status."""
    rows = await connection.execute(
        sa.select(dd.c.status, sa.func.count())
        .where(
            dd.c.deployment_id == deployment["id"],
            dd.c.stage <= deployment["stage"],
            dd.c.status.in_(FINISHED),
        )
        .group_by(dd.c.status)
    )
    return Tally.of({name: int(count) for name, count in rows})


async def unanswered(
    connection: AsyncConnection, deployment_id: str
) -> tuple[list[str], int | None]:
    """Devices an envelope was recorded for that have not answered, and the highest serial
    the deployment recorded."""
    recorded = (dd.c.deployment_id == deployment_id, dd.c.envelope_sha256.is_not(None))
    rows = await connection.execute(
        sa.select(dd.c.device_id)
        .where(*recorded, dd.c.status.in_(UNANSWERED))
        .order_by(dd.c.device_id)
    )
    devices = [row[0] for row in rows]
    serial = await connection.scalar(sa.select(sa.func.max(dd.c.serial)).where(*recorded))
    return devices, None if serial is None else int(serial)
