"""Releases and deployments as durable rows, and the state machine's legal moves.

A deployment is created ``scheduled`` with its device list resolved once (explicit ids, or the
group's devices, optionally of one profile) and each device assigned its stage; the controller
moves it to ``running`` (stage k) and on to ``succeeded`` or ``aborted``. People may pause,
resume, abort, or roll it back to an earlier version (a new deployment of that release to the
devices this one reached). Every change is one transaction, so a crash leaves a consistent row
for the controller to resume from.

Serials: devices refuse a release whose serial is not above the one they hold, so the server
keeps a counter per model (``model_serials``: above every serial it signed, sent or received)
and, when it signs (``--release-key``), takes each envelope's serial from it (``next_serial``)
in the transaction that records what it will send. A rollback is then the old manifest
re-issued: a fresh serial and lifetime, which devices accept. Without a key the server can only
relay uploads, so it refuses a deployment whose serial is not above one it already sent
(``check_serial``): devices would refuse it as a replay.

Agent releases (``kind`` "agent", model ``edgeagent``) are code: the server never signs one, so
it relays the upload, after ``check_serial``, whatever keys it holds; it sends one only to the
targeted devices whose reported platform and Python it has a wheelhouse for (the rest are
``left_out``, counted by why), and never rolls one back: a device whose new agent fails rolls
back by itself, and a downgrade is a newly signed release of the older version.

Locks: every writer of ``deployment_devices`` rows — the controller, the ingest, people's
actions — takes them in one order, by (deployment, device id) (``lock_devices``), so on
PostgreSQL two transactions never each hold a row the other waits for (a deadlock).
"""

from __future__ import annotations

import hashlib
import secrets
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncConnection

from edgeagent.fleet.agent_manifest import AgentManifest
from edgeagent.fleet.manifest import MAX_SERIAL
from edgeagent.hub.policy import FINISHED, TIMED_OUT, RolloutPolicy
from edgeagent.hub.server.schema import (
    deployment_devices,
    deployments,
    devices,
    model_serials,
    releases,
)
from edgeagent.hub.verify import AnyRelease, kind_of, model_of, read_manifest

ACTIVE = ("scheduled", "running", "paused")
FINAL = ("succeeded", "aborted", "rolled_back")
STATES = ACTIVE + FINAL
NOT_SENT = "not_sent"  # a device the deployment ended (aborted, rolled back) before sending to
CANCELLED = "cancelled"  # an aborted deployment's device that refused its release: cancelled
DEVICE_STATUSES = ("queued", "sent", *FINISHED, NOT_SENT, CANCELLED)
# rows an aborted deployment may have sent its release to that have not answered (yet)
UNANSWERED = ("queued", "sent", TIMED_OUT, NOT_SENT)
MAX_LEFT_OUT_REASONS = 10  # distinct reasons an agent deployment names; the rest are "other"
dd = deployment_devices
MOVES = {  # action → (states it may start from, state it leads to)
    "pause": (("scheduled", "running"), "paused"),
    "resume": (("paused",), "running"),
    "abort": (ACTIVE, "aborted"),
    "rollback": ((*ACTIVE, "succeeded", "aborted"), "rolled_back"),
}


class DeploymentError(Exception):
    """A request the state machine refuses; ``status`` is the HTTP status it maps to."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True)
class TargetSpec:
    """Who a deployment is for: explicit devices, or a group (optionally one profile)."""

    group: str = ""
    device_ids: tuple[str, ...] = ()
    profile: str = ""


async def add_release(
    connection: AsyncConnection, envelope: bytes, manifest: AnyRelease
) -> tuple[dict[str, Any], bool]:
    """Store a verified release (a model's or the agent's) once (same bytes → same row);
    returns (row, created)."""
    digest = hashlib.sha256(envelope).hexdigest()
    found = await _one(connection, sa.select(releases).where(releases.c.sha256 == digest))
    if found is not None:
        return found, False
    covers = (  # what an agent release can be installed on (GET releases shows it)
        {"platforms": [w.platform for w in manifest.wheelhouses], "python": manifest.python}
        if isinstance(manifest, AgentManifest)
        else {}
    )
    await connection.execute(
        releases.insert().values(
            kind=kind_of(manifest),
            model=model_of(manifest),
            version=manifest.version,
            release_tag=manifest.deployment_id,
            sha256=digest,
            envelope=envelope,
            **covers,
            created_at=time.time(),
        )
    )
    await note_serial(connection, model_of(manifest), manifest.serial)
    created = await _one(connection, sa.select(releases).where(releases.c.sha256 == digest))
    assert created is not None
    return created, True


def release_manifest(envelope: bytes) -> AnyRelease:
    """The manifest of a stored envelope (checked when it was uploaded)."""
    return read_manifest(envelope, max_bytes=len(envelope))


def _insert_serial(connection: AsyncConnection, model: str, serial: int) -> Any:
    dialect = sqlite if connection.dialect.name == "sqlite" else postgresql
    return dialect.insert(model_serials).values(model=model, serial=serial)


async def note_serial(connection: AsyncConnection, model: str, serial: int) -> None:
    """Raise the counter of ``model`` to at least ``serial`` (a release the server received)."""
    insert = _insert_serial(connection, model, serial)
    held, new = model_serials.c.serial, insert.excluded.serial
    await connection.execute(
        insert.on_conflict_do_update(
            index_elements=["model"], set_={"serial": sa.case((held < new, new), else_=held)}
        )
    )


async def next_serial(connection: AsyncConnection, model: str) -> int:
    """The next serial of ``model``, above every serial the server signed, sent or received
    for it; taken in the caller's transaction, so it is committed with what records it (or
    not at all) and before anything signed with it is sent."""
    insert = _insert_serial(connection, model, 1)
    serial = await connection.scalar(
        insert.on_conflict_do_update(
            index_elements=["model"], set_={"serial": model_serials.c.serial + 1}
        ).returning(model_serials.c.serial)
    )
    if serial is None or serial > MAX_SERIAL:
        raise DeploymentError(409, f"{model} has used every release serial (2^53-1)")
    return int(serial)


async def sent_serial(
    connection: AsyncConnection,
    model: str,
    *,
    other_than: str | None = None,
    relayed_only: bool = False,
) -> int | None:
    """The highest serial recorded as sent (or about to be) to a device for ``model``, by any
    deployment but ``other_than``; ``relayed_only``: only uploads sent unchanged."""
    dd = deployment_devices
    joined = dd.join(deployments, deployments.c.id == dd.c.deployment_id)
    query = sa.select(sa.func.max(dd.c.serial)).where(
        deployments.c.model == model, dd.c.serial.is_not(None)
    )
    if other_than is not None:
        query = query.where(deployments.c.id != other_than)
    if relayed_only:
        joined = joined.join(releases, releases.c.id == deployments.c.release_id)
        query = query.where(dd.c.envelope_sha256 == releases.c.sha256)
    value = await connection.scalar(query.select_from(joined))
    return None if value is None else int(value)


async def _sent_with(connection: AsyncConnection, release: dict[str, Any], serial: int) -> bool:
    """Whether ``serial`` went out in this release's own uploaded envelope."""
    dd = deployment_devices
    query = (
        sa.select(dd.c.device_id)
        .join(deployments, deployments.c.id == dd.c.deployment_id)
        .where(
            deployments.c.model == release["model"],
            dd.c.serial == serial,
            dd.c.envelope_sha256 == hashlib.sha256(release["envelope"]).hexdigest(),
        )
        .limit(1)
    )
    return await connection.scalar(query) is not None


async def check_serial(
    connection: AsyncConnection,
    release: dict[str, Any],
    *,
    other_than: str | None = None,
    relayed_only: bool = False,
    rollback: bool = False,
) -> None:
    """The server serial check before send, for a server that relays uploads unchanged: 409
    unless the release's serial is above every serial already sent for its model, or it is
    the very envelope that carried the highest one (a retry: devices that failed it never
    raised their floor and take it again; those that committed it answer ``same_version``)."""
    serial = release_manifest(release["envelope"]).serial
    floor = await sent_serial(
        connection, release["model"], other_than=other_than, relayed_only=relayed_only
    )
    if floor is None or serial > floor:
        return
    if serial == floor and await _sent_with(connection, release, serial):
        return
    what = f"{release['model']} {release['version']} carries serial {serial}"
    if release.get("kind") == "agent":  # never signed by the server, whatever its keys
        fix = "sign it again with a new serial (hub sign --agent) and upload it"
    elif rollback:
        fix = (
            "a rollback needs --release-key (the server re-signs the old release with a fresh "
            "serial), or upload that version signed again with a new serial (hub sign)"
        )
    else:
        fix = (
            "sign it again with a new serial (hub sign) and upload it, or run the server "
            "with --release-key to sign what it sends with fresh serials"
        )
    raise DeploymentError(
        409,
        f"{what}, not above serial {floor} this server already sent for {release['model']}: "
        f"devices would refuse it as a replay; {fix}",
    )


async def lock_devices(
    connection: AsyncConnection, *where: sa.ColumnElement[bool], limit: int | None = None
) -> list[str]:
    """Lock the ``deployment_devices`` rows matching ``where`` (the first ``limit``) in the one
    order every writer takes them in, (deployment, device id); returns their device ids.

    PostgreSQL locks the rows of a ``SELECT … ORDER BY … FOR UPDATE`` in that order, so an
    UPDATE of them afterwards waits for nobody. SQLite has one writer at a time and no row
    locks (SQLAlchemy renders no ``FOR UPDATE`` there)."""
    dd = deployment_devices
    query = sa.select(dd.c.device_id).where(*where).order_by(dd.c.deployment_id, dd.c.device_id)
    if limit is not None:
        query = query.limit(limit)
    return [row[0] for row in await connection.execute(query.with_for_update())]


async def stop_sending(connection: AsyncConnection, deployment_id: str) -> None:
    """The devices a deployment that ended early never sent to: ``not_sent``, not "queued"
    (nothing will send to them any more)."""
    dd = deployment_devices
    where = (dd.c.deployment_id == deployment_id, dd.c.status == "queued")
    await lock_devices(connection, *where)
    await connection.execute(dd.update().where(*where).values(status=NOT_SENT))


def release_view(row: dict[str, Any]) -> dict[str, Any]:
    """A release as the API shows it (the envelope has its own route)."""
    return {k: v for k, v in row.items() if k != "envelope"}


async def get_release(connection: AsyncConnection, release_id: int) -> dict[str, Any] | None:
    return await _one(connection, sa.select(releases).where(releases.c.id == release_id))


async def find_release(
    connection: AsyncConnection, model: str, version: str
) -> dict[str, Any] | None:
    """The newest stored release of ``model`` at ``version``."""
    query = (
        sa.select(releases)
        .where(releases.c.model == model, releases.c.version == version)
        .order_by(releases.c.id.desc())
    )
    return await _one(connection, query)


async def list_releases(connection: AsyncConnection, model: str = "") -> list[dict[str, Any]]:
    query = sa.select(releases).order_by(releases.c.id.desc())
    if model:
        query = query.where(releases.c.model == model)
    return [release_view(dict(r._mapping)) for r in await connection.execute(query)]


async def _resolve_targets(
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


async def create_deployment(
    connection: AsyncConnection,
    release: dict[str, Any],
    targets: TargetSpec,
    policy: RolloutPolicy,
    *,
    rollback_of: str | None = None,
    signs: bool | None = None,
) -> str:
    """Insert a ``scheduled`` deployment with its devices and their stages; returns its id.

    The row stores ``policy.fields()``, from which the controller rebuilds the policy on every
    pass (``hub.policy.stored_policy``), so a restarted hub applies the same rules.

    ``signs``: whether the server signs what it sends (``--release-key``). False: it relays
    the upload, whose serial must be above every serial already sent (``check_serial``);
    None (a caller that does not know): only the uploads it relayed before count. A rollback
    the server signs is re-issued: its envelopes get today's date and the release's lifetime
    (an old release may have expired) besides their fresh serials. An agent release is always
    relayed (``signs`` is not asked), to the targeted devices it has a wheelhouse for
    (``agent_devices``; the row's ``left_out`` counts the others).
    """
    if not targets.group and not targets.device_ids:
        raise DeploymentError(422, "say who gets it: 'group' and/or 'devices'")
    busy = await _one(
        connection,
        sa.select(deployments.c.id).where(
            deployments.c.model == release["model"], deployments.c.state.in_(ACTIVE)
        ),
    )
    if busy is not None:
        raise DeploymentError(
            409,
            f"deployment {busy['id']} of {release['model']} is still active: finish, "
            "abort or roll it back first",
        )
    found = await _resolve_targets(connection, targets)
    if not found:
        raise DeploymentError(422, "no device known to the hub matches these targets")
    device_list, left_out = [device_id for device_id, _, _ in found], None
    agent = release["kind"] == "agent"
    if agent:
        device_list, left_out = agent_devices(release, found)
        if not device_list:
            raise DeploymentError(
                422,
                f"none of the {len(found)} targeted device(s) can install it: "
                + left_out_text(left_out),
            )
    if agent or signs is not True:
        await check_serial(
            connection, release, relayed_only=signs is None, rollback=rollback_of is not None
        )
    sizes = policy.stage_sizes(len(device_list))
    deployment_id = f"dep-{secrets.token_hex(6)}"
    now = time.time()
    dates: dict[str, float] = {}
    if signs and rollback_of is not None:
        manifest = release_manifest(release["envelope"])
        issued = float(int(now))  # manifests carry whole seconds
        dates = {
            "issued_at": issued,
            "expires": issued + (manifest.expires - manifest.issued_at).total_seconds(),
        }
    await connection.execute(
        deployments.insert().values(
            id=deployment_id,
            release_id=release["id"],
            model=release["model"],
            group_name=targets.group,
            profile_filter=targets.profile,
            **policy.fields(),
            state="scheduled",
            stage=0,
            stage_count=len(sizes),
            rollback_of=rollback_of,
            **dates,
            left_out=left_out,
            created_at=now,
            updated_at=now,
        )
    )
    rows, start = [], 0
    for stage, end in enumerate(sizes, 1):
        rows += [
            {"deployment_id": deployment_id, "device_id": d, "stage": stage, "status": "queued"}
            for d in device_list[start:end]
        ]
        start = end
    await connection.execute(deployment_devices.insert(), rows)
    return deployment_id


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
    row = await _one(connection, sa.select(deployments).where(deployments.c.id == deployment_id))
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


async def move(
    connection: AsyncConnection, deployment_id: str, action: str, reason: str = ""
) -> dict[str, Any]:
    """Apply a person's action (pause, resume, abort, rollback) if the state allows it."""
    row = await _one(connection, sa.select(deployments).where(deployments.c.id == deployment_id))
    if row is None:
        raise DeploymentError(404, f"no deployment {deployment_id!r}")
    sources, target = MOVES[action]
    if row["state"] not in sources:
        raise DeploymentError(409, f"cannot {action} a deployment that is {row['state']}")
    changes: dict[str, Any] = {"state": target, "updated_at": time.time()}
    if action == "resume":  # the resumed stage gets its whole in-progress time-out again
        changes["stage_started_at"] = time.time() if row["stage"] else None
        changes["state"] = "running" if row["stage"] else "scheduled"
    if reason:
        changes["reason"] = reason[:1000]
    await connection.execute(
        deployments.update().where(deployments.c.id == deployment_id).values(**changes)
    )
    if changes["state"] in ("aborted", "rolled_back"):
        await stop_sending(connection, deployment_id)
    return {**row, **changes}


async def reached_devices(connection: AsyncConnection, deployment_id: str) -> list[str]:
    """Devices this deployment sent its release to, or may have (what a rollback must put
    right): every one that answered, was marked sent, or had an envelope recorded for it."""
    dd = deployment_devices
    rows = await connection.execute(
        sa.select(dd.c.device_id).where(
            dd.c.deployment_id == deployment_id,
            sa.or_(dd.c.status.not_in(("queued", NOT_SENT)), dd.c.envelope_sha256.is_not(None)),
        )
    )
    return sorted(r[0] for r in rows)


async def rollback(
    connection: AsyncConnection,
    deployment_id: str,
    version: str,
    policy: RolloutPolicy,
    *,
    signs: bool,
) -> str:
    """Stop ``deployment_id`` and deploy ``version`` of its model to every device it reached;
    returns the new deployment's id. One transaction with the caller's: when the new
    deployment is refused (no such release, another one active, a serial devices would refuse
    without ``signs``) nothing changes, the old deployment's state included."""
    old = await _one(connection, sa.select(deployments).where(deployments.c.id == deployment_id))
    if old is None:
        raise DeploymentError(404, f"no deployment {deployment_id!r}")
    deployed = await get_release(connection, old["release_id"])
    if deployed is not None and deployed["kind"] == "agent":
        raise DeploymentError(
            422,
            f"deployment {deployment_id} is of an agent release, which the hub does not roll "
            "back: a device whose new agent fails its switch rolls back by itself (its boot "
            "check), and a downgrade of the agent is a new agent release of the older version "
            "(hub sign --agent gives it a new serial): upload that and deploy it",
        )
    release = await find_release(connection, old["model"], version)
    if release is None:
        raise DeploymentError(404, f"no release of {old['model']} {version} on the hub")
    reached = await reached_devices(connection, deployment_id)
    if not reached:
        raise DeploymentError(409, "this deployment reached no device: nothing to undo")
    await move(connection, deployment_id, "rollback", f"rolled back to {version}")
    return await create_deployment(
        connection,
        release,
        TargetSpec(group=old["group_name"], device_ids=tuple(reached)),
        policy,
        rollback_of=deployment_id,
        signs=signs,
    )


async def record_outcome(
    connection: AsyncConnection,
    device_id: str,
    release_tag: str,
    *,
    outcome: str,
    result: str,
    code: str,
    message: str,
    now: float,
    ended_at: float | None = None,
) -> bool:
    """A device's answer to an active deployment of the release tagged ``release_tag``.

    An answer from a device still ``queued`` counts too: it got the release (the hub crashed
    between sending and recording), so it must not be sent again. With ``ended_at`` the answer
    comes from the device's state report (its last outcome, repeated), which also covers an
    event the broker dropped; it counts only when it ended after the deployment's current stage
    began (``stage_started_at`` is written before the stage is sent), so an older outcome of
    the same release (a rollback re-using it) is not taken for this one.

    An answer that no active deployment waits for may be a late one to an aborted deployment
    (``late_answer``).
    """
    query = (
        sa.select(deployments.c.id)
        .join(releases, releases.c.id == deployments.c.release_id)
        .where(releases.c.release_tag == release_tag, deployments.c.state.in_(ACTIVE))
    )
    if ended_at is not None:
        query = query.where(deployments.c.stage_started_at <= ended_at)
    result_ = await connection.execute(
        deployment_devices.update()
        .where(
            deployment_devices.c.deployment_id == query.scalar_subquery(),
            deployment_devices.c.device_id == device_id,
            deployment_devices.c.status.in_(("queued", "sent")),
        )
        .values(status=outcome, answered_at=now, result=result, code=code, message=message)
    )
    if result_.rowcount:
        return True
    answer = {"answered_at": now, "result": result, "code": code, "message": message}
    status = CANCELLED if (result, code) == ("refused", CANCELLED) else outcome
    return await late_answer(connection, device_id, release_tag, status, answer, ended_at)


async def late_answer(
    connection: AsyncConnection,
    device_id: str,
    release_tag: str,
    status: str,
    answer: dict[str, Any],
    ended_at: float | None,
) -> bool:
    """Record a device's answer to the last aborted deployment of ``release_tag`` that may have
    sent it the release (an envelope recorded for it) and heard nothing from it: a device
    offline during the abort answers when it comes back — ``cancelled`` when it held the
    hub's cancellation, or the install's real outcome when it took the release before that
    reached it — instead of staying ``timed_out`` while the fleet table shows the new version.
    """
    where = [
        releases.c.release_tag == release_tag,
        deployments.c.state == "aborted",
        dd.c.device_id == device_id,
        dd.c.status.in_(UNANSWERED),
        dd.c.envelope_sha256.is_not(None),
    ]
    if ended_at is not None:
        where.append(deployments.c.stage_started_at <= ended_at)
    found = await connection.scalar(
        sa.select(dd.c.deployment_id)
        .join(deployments, deployments.c.id == dd.c.deployment_id)
        .join(releases, releases.c.id == deployments.c.release_id)
        .where(*where)
        .order_by(deployments.c.created_at.desc())
        .limit(1)
    )
    if found is None:
        return False
    row = (dd.c.deployment_id == found, dd.c.device_id == device_id, dd.c.status.in_(UNANSWERED))
    await lock_devices(connection, *row)
    updated = await connection.execute(dd.update().where(*row).values(status=status, **answer))
    return bool(updated.rowcount)


async def _one(connection: AsyncConnection, query: sa.Select[Any]) -> dict[str, Any] | None:
    row = (await connection.execute(query)).first()
    return None if row is None else dict(row._mapping)
