"""Who a deployment is for: the targeted devices, resolved once when it is created.

Explicit device ids, or a group's devices, optionally of one profile; an id the hub does not
know (or outside the filter) refuses the deployment. An agent release goes only to the targeted
devices whose reported platform and Python it has a wheelhouse for; the rest are ``left_out``,
counted by why.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from edgeagent.hub.server.releasedb import DeploymentError
from edgeagent.hub.server.schema import devices

MAX_LEFT_OUT_REASONS = 10  # distinct reasons an agent deployment names; the rest are "other"


@dataclass(frozen=True)
class TargetSpec:
    """Who a deployment is for: explicit devices, or a group (optionally one profile)."""

    group: str = ""
    device_ids: tuple[str, ...] = ()
    profile: str = ""


async def resolve_targets(
    connection: AsyncConnection, targets: TargetSpec
) -> list[tuple[str, str, str]]:
    """The targeted devices by id, each with its reported (platform, Python)."""
    query = sa.select(devices.c.device_id, devices.c.platform, devices.c.python)
    if targets.device_ids:
        query = query.where(devices.c.device_id.in_(targets.device_ids))
    if targets.group:
        query = query.where(devices.c.group_name == targets.group)
    if targets.profile:
        query = query.where(devices.c.profile == targets.profile)
    found = sorted((row[0], row[1], row[2]) for row in await connection.execute(query))
    unknown = sorted(set(targets.device_ids) - {device_id for device_id, _, _ in found})
    if unknown:
        shown = ", ".join(unknown[:10])
        raise DeploymentError(
            422, f"{len(unknown)} device(s) unknown to the hub or outside the filter: {shown}"
        )
    return found


def agent_devices(
    release: dict[str, Any], found: Sequence[tuple[str, str, str]]
) -> tuple[list[str], dict[str, Any]]:
    """The devices of ``found`` (id, platform, Python) an agent release has a wheelhouse for,
    and the others counted by why: ``{"devices": n, "reasons": {why: count}}``.

    A device that reports no platform (an agent from before self-updates) is left out too:
    it could not install the release. At most ``MAX_LEFT_OUT_REASONS`` reasons are named
    (platforms are what devices report), the rest are counted as "other"."""
    platforms, python = set(release["platforms"] or ()), release["python"]
    kept: list[str] = []
    why: Counter[str] = Counter()
    for device_id, platform, device_python in found:
        if not platform or not device_python:
            why["reports no platform or Python (an agent without self-updates)"] += 1
        elif platform not in platforms:
            why[f"platform {platform}: no wheelhouse in this release"] += 1
        elif device_python != python:
            why[f"Python {device_python}: the release's wheels are for Python {python}"] += 1
        else:
            kept.append(device_id)
    named = dict(why.most_common(MAX_LEFT_OUT_REASONS))
    other = sum(why.values()) - sum(named.values())
    reasons = {**named, **({"other platforms or Pythons": other} if other else {})}
    return kept, {"devices": sum(why.values()), "reasons": reasons}


def left_out_text(left_out: dict[str, Any]) -> str:
    """``agent_devices``' count of left-out devices, for people."""
    return "; ".join(f"{count} {why}" for why, count in left_out["reasons"].items())
