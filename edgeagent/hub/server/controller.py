"""The rollout controller: drives every running deployment from its rows, so it survives a crash.

Each pass reads the deployments that are ``scheduled`` or ``running`` and, for the current stage
k: sends the release to the stage's devices still ``queued``, one batch at a time, never twice
(``batches``: what each batch is sent, recorded before it is published); when the deployment's
rollout policy (``hub/policy/``, rebuilt from the row, the same rules ``hub rollout`` follows)
says the stage is over — every device answered, or its time-out from ``stage_started_at``
passed — the silent ones become ``timed_out`` and the policy's verdict on every finished device
so far aborts the deployment (its devices never sent become ``not_sent``), ends it
(``succeeded``) or starts stage k+1. Nothing lives only in memory: after a restart the first
pass carries on where the rows say.

Lock order: each write of device rows locks them first in (deployment, device id) order
(``deploydb.lock_devices``), the order the ingest writes answers in, so the two never deadlock
on PostgreSQL.

An aborted deployment (by its policy or by a person) is then cancelled once: its retained slot
cleared if it holds the release, and a signed cancellation sent behind the release to every
device that may hold it unanswered (``server.cancel``), so a device that was offline during
the abort does not install it when it comes back.

The controller only decides, in one place (``_advance``): what it reads comes from
``deployreads``, and every move is one of ``deploydb``'s named transitions (``enter_stage``,
``time_out_stage``, ``conclude_stage``: the verdict's ``abort``, ``succeed`` or next stage), in
a transaction it opens; the sending of a stage is its ``BatchSender``'s.

The controller sleeps until the nearest stage deadline or until ``wake()`` (a device answered,
a person acted, the broker reconnected, this replica took the lease over).

Replicas: several hub servers may share one PostgreSQL database; each runs a controller, and
only the one whose replica holds the controller's lease acts (``leadership``: the controller
asks, the database decides). Every move it makes carries the lease's fencing token, which the
database checks in the move's transaction, so a controller that lost the lease while paused
moves and sends nothing when it wakes (``NotLeader``); the new leader's first pass carries on
from the rows, as after a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from edgeagent.hub.policy import stored_policy
from edgeagent.hub.server import deploydb, deployreads
from edgeagent.hub.server.batches import BatchSender, Publish, Sign
from edgeagent.hub.server.cancel import Canceller, ClearSlot, SignCancel
from edgeagent.hub.server.changes import Changes
from edgeagent.hub.server.leadership import Leadership, NotLeader

log = logging.getLogger(__name__)

RETRY_S = 5.0  # after a failed pass (broker or database away), unless woken sooner
LONE_LEASE_S = 3600.0  # a controller without a Leadership of the server's (tests, tools)


class RolloutController:
    """One per server. ``publish`` sends one QoS 1 message (raises when the broker is down);
    ``leadership`` says whether this replica leads (None: a lone controller of its own,
    which takes the lease at its first pass, as on SQLite)."""

    def __init__(
        self,
        engine: AsyncEngine,
        publish: Publish,
        prefix: str,
        changes: Changes,
        *,
        send_batch: int = 100,
        sign: Sign | None = None,
        sign_cancel: SignCancel | None = None,
        clear_slot: ClearSlot | None = None,
        leadership: Leadership | None = None,
    ) -> None:
        self.engine = engine
        self.publish = publish
        self.prefix = prefix
        self.changes = changes  # bumped after every pass that changed a deployment
        self._wake = asyncio.Event()
        self._lone = leadership is None
        self.leadership = leadership or Leadership(
            engine, "controller", lease_s=LONE_LEASE_S, renew_s=LONE_LEASE_S / 2
        )
        self.leadership.on_gained = self.wake
        self.sender = BatchSender(
            engine, publish, prefix, send_batch=send_batch, sign=sign, leadership=self.leadership
        )
        self.canceller = Canceller(
            engine,
            publish,
            prefix,
            leadership=self.leadership,
            sign=sign_cancel,
            clear_slot=clear_slot,
        )

    def wake(self) -> None:
        self._wake.set()

    async def run(self, ready: asyncio.Event | None = None) -> None:
        """Pass after pass until cancelled; a failing pass is logged and retried.

        The first pass waits for ``ready`` (the ingest's sync): the answers devices sent while
        the hub was down arrive, from its persistent session, before the sync marker — so the
        controller starts from what they said instead of sending the release to them again.
        """
        if ready is not None:
            await ready.wait()
        while True:
            self._wake.clear()
            try:
                if not (self._lone or self.leadership.leading()):  # another replica leads
                    deadline = None
                else:
                    deadline = await self.run_once()
            except NotLeader as exc:  # the lease lapsed mid-pass: the new leader carries on
                log.warning("rollout controller stopped: %s", exc)
                deadline = None
            except Exception:  # the broker or the database away: try again on the next wake
                log.exception("rollout controller pass failed; retrying")
                deadline = time.time() + RETRY_S
            timeout = None if deadline is None else max(0.0, deadline - time.time())
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    async def run_once(self) -> float | None:
        """Advance every active deployment; returns the nearest stage deadline (or None).
        Raises ``NotLeader`` when this replica does not hold the controller's lease."""
        if self._lone and not self.leadership.leading():  # it takes (renews) the lease itself
            await self.leadership.claim_once()
        await self.sender.mark_unmarked()  # before anything could send them again
        async with self.engine.connect() as connection:
            active = await deployreads.active_deployments(connection)
        self.sender.keep_releases_of({deployment["id"] for deployment in active})
        deadlines = []
        for deployment in active:
            deadline = await self._advance(deployment)
            if deadline is not None:
                deadlines.append(deadline)
        if await self.canceller.run_once():
            await self.changes.bump()
        return min(deadlines, default=None)

    async def _advance(self, deployment: dict[str, Any]) -> float | None:
        """Move one deployment as far as it can go now. The one place its stages are decided,
        from what it reads; each move is one of ``deploydb``'s transitions, and the sending of
        a stage is the sender's (``batches``)."""
        changed = False
        policy = stored_policy(deployment)
        try:
            while True:
                if deployment["state"] == "scheduled":
                    log.info(
                        "deployment %s: stage 1 of %d", deployment["id"], deployment["stage_count"]
                    )
                    async with self.engine.begin() as connection:
                        deployment = await deploydb.enter_stage(
                            connection, deployment, 1, token=self.leadership.check()
                        )
                    changed = True
                if deployment["state"] != "running":  # paused or aborted by a person meanwhile
                    return None
                deployment, sent = await self.sender.send_queued(deployment)
                changed |= sent
                if deployment["state"] != "running":  # refused by the serial check
                    return None
                started = deployment["stage_started_at"]
                async with self.engine.connect() as connection:
                    waiting = await deployreads.waiting_count(connection, deployment)
                if not policy.stage_over(waiting, started, time.time()):
                    return policy.deadline(started)
                async with self.engine.begin() as connection:  # the silent ones time out first
                    await deploydb.time_out_stage(
                        connection, deployment, token=self.leadership.check()
                    )
                async with self.engine.connect() as connection:
                    tally = await deployreads.tally(connection, deployment)
                verdict = policy.verdict(deployment["stage"], deployment["stage_count"], tally)
                if verdict.state == "aborted":
                    log.warning("deployment %s aborted: %s", deployment["id"], verdict.reason)
                elif verdict.state == "succeeded":
                    log.info("deployment %s succeeded (%d failed)", deployment["id"], tally.failed)
                else:
                    stage, count = deployment["stage"] + 1, deployment["stage_count"]
                    log.info("deployment %s: stage %d of %d", deployment["id"], stage, count)
                async with self.engine.begin() as connection:
                    deployment = await deploydb.conclude_stage(
                        connection, deployment, verdict, token=self.leadership.check()
                    )
                changed = True
        finally:
            if changed:
                await self.changes.bump()
