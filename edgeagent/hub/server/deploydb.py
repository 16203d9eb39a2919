"""Deployments' state and every move of it: the one writer of ``deployments`` and
``deployment_devices`` rows.

A deployment is created ``scheduled`` with its device list resolved once (``targets``) and each
device assigned its stage; the controller moves it to ``running`` (stage k) and on to
``succeeded`` or ``aborted``. People may pause, resume, abort, or roll it back to an earlier
version (a new deployment of that release to the devices this one reached). Every change is a
named transition here — people's (``move``, ``rollback``), the controller's (``enter_stage``,
``time_out_stage``, ``conclude_stage``, ``abort``, ``succeed``) and its sender's
(``claim_batch``, ``record_batch``, ``mark_sent``, ``abort``), the canceller's
(``mark_cancelled``) and the devices' answers (``record_outcome``, ``late_answer``) — run in
the caller's transaction, so a crash leaves a consistent row for the controller to resume
from. Callers decide; nothing else writes these rows (the reads are in ``deployreads``).

The controller's moves are guarded: each writes only if the state and stage are still the ones
it decided from (a person pausing meanwhile wins), and says ``changed`` otherwise. They are
fenced too: each takes the controller's fencing token (``leadership``) and is refused
(``NotLeader``) in a transaction where a newer controller holds the lease, so a replica that
lost it (paused, then woken) cannot move anything.

It stays one module past 500 lines on purpose: being the only writer is its job, and the state
machine's legal moves are checked by reading them side by side; its reads already live apart.

Agent releases are code: the server relays the upload and never rolls one back: a device whose
new agent fails rolls back by itself, and a downgrade is a newly signed release of the older
version.

Locks: every writer of ``deployment_devices`` rows — the controller, the ingest, people's
actions — takes them in one order, by (deployment, device id) (``lock_devices``), so on
PostgreSQL two transactions never each hold a row the other waits for (a deadlock).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from edgeagent.hub.policy import FINISHED, TIMED_OUT, RolloutPolicy, Verdict
from edgeagent.hub.release_checks import AnyRelease
from edgeagent.hub.server.leadership import fence
from edgeagent.hub.server.releasedb import (
    DeploymentError,
    check_serial,
    find_release,
    get_release,
    one_row,
    release_manifest,
)
from edgeagent.hub.server.schema import deployment_devices, deployments, releases
from edgeagent.hub.server.stage_windows import StageWindowError, read_stage_windows
from edgeagent.hub.server.targets import TargetSpec, agent_devices, left_out_text, resolve_targets

ACTIVE = ("scheduled", "running", "paused")
FINAL = ("succeeded", "aborted", "rolled_back")
STATES = ACTIVE + FINAL
NOT_SENT = "not_sent"  # a device the deployment ended (aborted, rolled back) before sending to
CANCELLED = "cancelled"  # an aborted deployment's device that refused its release: cancelled
DEVICE_STATUSES = ("queued", "sent", *FINISHED, NOT_SENT, CANCELLED)
# rows an aborted deployment may have sent its release to that have not answered (yet)
UNANSWERED = ("queued", "sent", TIMED_OUT, NOT_SENT)
dd = deployment_devices
MOVES = {  # action → (states it may start from, state it leads to)
    "pause": (("scheduled", "running"), "paused"),
    "resume": (("paused",), "running"),
    "abort": (ACTIVE, "aborted"),
    "rollback": ((*ACTIVE, "succeeded", "aborted"), "rolled_back"),
}


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


async def create_deployment(
    connection: AsyncConnection,
    release: dict[str, Any],
    targets: TargetSpec,
    policy: RolloutPolicy,
    *,
    rollback_of: str | None = None,
    signs: bool | None = None,
    stage_windows: Sequence[dict[str, Any]] = (),
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
    busy = await one_row(
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
    found = await resolve_targets(connection, targets)
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
    try:
        windows = read_stage_windows(stage_windows, len(sizes), signs=bool(signs), agent=agent)
    except StageWindowError as exc:
        raise DeploymentError(422, str(exc)) from exc
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
            stage_windows=windows,
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


async def move(
    connection: AsyncConnection, deployment_id: str, action: str, reason: str = ""
) -> dict[str, Any]:
    """Apply a person's action (pause, resume, abort, rollback) if the state allows it."""
    row = await one_row(connection, sa.select(deployments).where(deployments.c.id == deployment_id))
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
    old = await one_row(connection, sa.select(deployments).where(deployments.c.id == deployment_id))
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


@dataclass(frozen=True)
class Claim:
    """The next devices of a stage to send to, locked in the caller's transaction: ones
    recorded but still queued (a crash or the broker away after the record), with what was
    recorded for them, or else ones never recorded."""

    devices: list[str]
    sha256: str | None = None  # recorded: the envelope they are to be sent
    serial: int | None = None
    batch: tuple[str, ...] = ()  # recorded: every device of that envelope (its targets)


async def claim_batch(
    connection: AsyncConnection, deployment: dict[str, Any], limit: int
) -> Claim | None:
    """The devices of the current stage to send to next (None: all sent): the recorded ones
    first, all of one envelope; then at most ``limit`` never recorded."""
    queued = (
        dd.c.deployment_id == deployment["id"],
        dd.c.stage == deployment["stage"],
        dd.c.status == "queued",
    )
    recorded = (
        await connection.execute(
            sa.select(dd.c.envelope_sha256, dd.c.serial)
            .where(*queued, dd.c.envelope_sha256.is_not(None))
            .order_by(dd.c.device_id)
            .limit(1)
        )
    ).first()
    if recorded is not None:
        sha256, serial = recorded
        devices = await lock_devices(connection, *queued, dd.c.envelope_sha256 == sha256)
        rows = await connection.execute(
            sa.select(dd.c.device_id)
            .where(dd.c.deployment_id == deployment["id"], dd.c.envelope_sha256 == sha256)
            .order_by(dd.c.device_id)
        )
        return Claim(devices, sha256, serial, tuple(row[0] for row in rows))
    devices = await lock_devices(connection, *queued, dd.c.envelope_sha256.is_(None), limit=limit)
    return Claim(devices) if devices else None


async def relay_serial(
    connection: AsyncConnection, deployment: dict[str, Any], release: AnyRelease
) -> int:
    """The serial of the uploaded envelope (``release``, its manifest) a relaying server sends,
    after the server serial check against every other deployment (``DeploymentError``:
    devices would refuse it as a replay)."""
    row = {**deployment, "version": release.version}
    await check_serial(connection, row, other_than=deployment["id"], serial=release.serial)
    return release.serial


async def record_batch(
    connection: AsyncConnection,
    deployment_id: str,
    devices: list[str],
    sha256: str,
    serial: int,
    *,
    token: int,
) -> None:
    """Record on ``devices`` (locked, queued) the envelope they will be sent, before it is
    (fenced)."""
    await fence(connection, token)
    await connection.execute(
        dd.update()
        .where(dd.c.deployment_id == deployment_id, dd.c.device_id.in_(devices))
        .values(envelope_sha256=sha256, serial=serial)
    )


async def mark_sent(
    connection: AsyncConnection,
    deployment_id: str,
    sha256: str,
    devices: list[str],
    *,
    token: int,
) -> None:
    """``devices`` were published the envelope ``sha256``: ``sent`` (rows an abort made
    ``not_sent`` meanwhile too: they were sent all the same). Fenced: the sender calls it in
    the transaction it fenced before publishing (``batches``)."""
    await fence(connection, token)
    where = (
        dd.c.deployment_id == deployment_id,
        dd.c.device_id.in_(devices),
        dd.c.envelope_sha256 == sha256,
        dd.c.status.in_(("queued", NOT_SENT)),
    )
    await lock_devices(connection, *where)
    await connection.execute(dd.update().where(*where).values(status="sent", sent_at=time.time()))


async def time_out_stage(
    connection: AsyncConnection, deployment: dict[str, Any], *, token: int
) -> None:
    """The current stage is over: its devices that have not answered are ``timed_out``
    (fenced)."""
    await fence(connection, token)
    silent = (
        dd.c.deployment_id == deployment["id"],
        dd.c.stage == deployment["stage"],
        dd.c.status.in_(("queued", "sent")),
    )
    await lock_devices(connection, *silent)
    await connection.execute(
        dd.update().where(*silent).values(status=TIMED_OUT, code=TIMED_OUT, answered_at=time.time())
    )


async def enter_stage(
    connection: AsyncConnection, deployment: dict[str, Any], stage: int, *, token: int
) -> dict[str, Any]:
    """``running`` stage ``stage``, its time-out counted from now (guarded, fenced)."""
    return await _guarded(
        connection, deployment, token, state="running", stage=stage, stage_started_at=time.time()
    )


async def abort(
    connection: AsyncConnection, deployment: dict[str, Any], reason: str, *, token: int
) -> dict[str, Any]:
    """The controller's abort (its policy's verdict, or the serial check refused what it would
    send): ``aborted``, its devices never sent ``not_sent`` (guarded, fenced)."""
    return await _guarded(connection, deployment, token, state="aborted", reason=reason)


async def succeed(
    connection: AsyncConnection, deployment: dict[str, Any], *, token: int
) -> dict[str, Any]:
    """The last stage is over and the policy is content: ``succeeded`` (guarded, fenced)."""
    return await _guarded(connection, deployment, token, state="succeeded")


async def conclude_stage(
    connection: AsyncConnection, deployment: dict[str, Any], verdict: Verdict, *, token: int
) -> dict[str, Any]:
    """The move the policy's verdict on a finished stage names: ``abort`` (its reason),
    ``succeed``, or the next stage entered (guarded and fenced, as each of them)."""
    if verdict.state == "aborted":
        return await abort(connection, deployment, verdict.reason, token=token)
    if verdict.state == "succeeded":
        return await succeed(connection, deployment, token=token)
    return await enter_stage(connection, deployment, deployment["stage"] + 1, token=token)


async def _guarded(
    connection: AsyncConnection, deployment: dict[str, Any], token: int, **changes: Any
) -> dict[str, Any]:
    """Write ``changes`` only if nobody (a person pausing) changed the state or stage since
    ``deployment`` was read, and the fencing ``token`` is still the controller's (else
    ``NotLeader``); returns the row as written, or with the state ``changed``."""
    await fence(connection, token)
    changes["updated_at"] = time.time()
    result = await connection.execute(
        deployments.update()
        .where(
            deployments.c.id == deployment["id"],
            deployments.c.state == deployment["state"],
            deployments.c.stage == deployment["stage"],
        )
        .values(**changes)
    )
    if not result.rowcount:
        return {**deployment, "state": "changed"}
    if changes.get("state") == "aborted":
        await stop_sending(connection, deployment["id"])
    return {**deployment, **changes}


async def mark_cancelled(connection: AsyncConnection, deployment_id: str, *, token: int) -> None:
    """An aborted deployment's cancellation was sent (``server.cancel``): never again
    (fenced)."""
    await fence(connection, token)
    await connection.execute(
        deployments.update()
        .where(deployments.c.id == deployment_id)
        .values(cancelled_at=time.time())
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
