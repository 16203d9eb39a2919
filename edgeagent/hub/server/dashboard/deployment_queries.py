"""The deployment page's own reads, beyond ``deployreads.get_deployment``: when each stage ran,
the device rows a filter keeps, and who a retry is for.

A status this module does not know (a newer hub's, such as ``not_sent``) is counted and shown,
never dropped: the stage totals here count every row, whatever its status.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from edgeagent.hub.policy import FAILURES
from edgeagent.hub.server.schema import deployment_devices

WAITING = ("queued", "sent")


@dataclass(frozen=True)
class StageTimes:
    """``devices`` counts every row of the stage; ``started`` is its first device sent,
    ``ended`` its last answer once none of its devices waits (None: not yet, or never)."""

    devices: int
    started: float | None
    ended: float | None


async def stage_times(connection: AsyncConnection, deployment_id: str) -> dict[int, StageTimes]:
    """One grouped query, so it costs the same at 10,000 devices as at ten."""
    rows = deployment_devices.c
    waiting = sa.func.sum(sa.case((rows.status.in_(WAITING), 1), else_=0))
    found = await connection.execute(
        sa.select(
            rows.stage,
            sa.func.count(),
            sa.func.min(rows.sent_at),
            sa.func.max(rows.answered_at),
            waiting,
        )
        .where(rows.deployment_id == deployment_id)
        .group_by(rows.stage)
    )
    return {
        stage: StageTimes(int(count), started, None if waits else ended)
        for stage, count, started, ended, waits in found
    }


async def device_rows(
    connection: AsyncConnection,
    deployment_id: str,
    *,
    failures_only: bool,
    limit: int,
    offset: int,
) -> tuple[list[dict[str, Any]], int]:
    """One page of the deployment's devices (all, or the failed and timed out) and how many
    there are in all."""
    rows = deployment_devices.c
    where = [rows.deployment_id == deployment_id]
    if failures_only:
        where.append(rows.status.in_(FAILURES))
    total = await connection.scalar(sa.select(sa.func.count()).where(*where))
    page = await connection.execute(
        sa.select(deployment_devices)
        .where(*where)
        .order_by(rows.stage, rows.device_id)
        .limit(limit)
        .offset(offset)
    )
    return [dict(r._mapping) for r in page], int(total or 0)


async def failed_devices(connection: AsyncConnection, deployment_id: str) -> list[str]:
    """Every device that failed or timed out: who a retry sends the release to again."""
    rows = deployment_devices.c
    found = await connection.execute(
        sa.select(rows.device_id)
        .where(rows.deployment_id == deployment_id, rows.status.in_(FAILURES))
        .order_by(rows.device_id)
    )
    return [r[0] for r in found]
