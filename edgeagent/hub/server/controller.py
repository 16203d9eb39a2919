"""The rollout controller: drives every running deployment from its rows, so it survives a crash.

Each pass reads the deployments that are ``scheduled`` or ``running`` and, for the current stage
k: sends the release to the stage's devices still ``queued`` (publish first, then mark ``sent``:
a crash in between only re-sends, which a device answers with ``same_version``); when the
deployment's rollout policy (``hub/policy/``, rebuilt from the row, the same rules ``hub
rollout`` follows) says the stage is over — every device answered, or its time-out from
``stage_started_at`` passed — the silent ones become ``timed_out`` and the policy's verdict on
every finished device so far aborts the deployment, ends it (``succeeded``) or starts stage
k+1. Nothing lives only in memory: after a restart the first pass carries on where the rows say.

What a device is sent: with the hub's release key(s) (``hub server --release-key``) the
controller signs one envelope per batch of a stage (at most ``send_batch`` devices, well under
the manifest's ``MAX_TARGETS``), the uploaded manifest with ``targets.device_ids`` set to that
batch — what ``hub rollout`` does per stage — so a copy replayed to any other device is refused
there as ``wrong_target``. Ed25519 is deterministic, so a re-send after a crash signs the very
same bytes. Without a key the uploaded envelope goes out unchanged. Either way each device's
row records the envelope's SHA-256 and the release serial next to its answer.

The controller sleeps until the nearest stage deadline or until ``wake()`` (a device answered,
a person acted, the broker reconnected).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from edgeagent.fleet.manifest import ReleaseManifest, parse_manifest
from edgeagent.fleet.signing import decode_envelope
from edgeagent.fleet.topics import Topics
from edgeagent.hub.policy import FINISHED, TIMED_OUT, RolloutPolicy, Tally, stored_policy
from edgeagent.hub.rollout import stage_manifest
from edgeagent.hub.server.changes import Changes
from edgeagent.hub.server.schema import deployment_devices, deployments, releases

log = logging.getLogger(__name__)

Publish = Callable[[str, bytes], Awaitable[None]]
Sign = Callable[[ReleaseManifest], bytes]
RETRY_S = 5.0  # after a failed pass (broker or database away), unless woken sooner


class RolloutController:
    """One per server. ``publish`` sends one QoS 1 message (raises when the broker is down)."""

    def __init__(
        self,
        engine: AsyncEngine,
        publish: Publish,
        prefix: str,
        changes: Changes,
        *,
        send_batch: int = 100,
        sign: Sign | None = None,
    ) -> None:
        self.engine = engine
        self.publish = publish
        self.prefix = prefix
        self.changes = changes  # bumped after every pass that changed a deployment
        self.send_batch = send_batch  # devices published to between two commits
        self.sign = sign  # the hub's release key(s); None: send the uploaded envelope
        self._wake = asyncio.Event()

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
                deadline = await self.run_once()
            except Exception:  # the broker or the database away: try again on the next wake
                log.exception("rollout controller pass failed; retrying")
                deadline = time.time() + RETRY_S
            timeout = None if deadline is None else max(0.0, deadline - time.time())
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    async def run_once(self) -> float | None:
        """Advance every active deployment; returns the nearest stage deadline (or None)."""
        async with self.engine.connect() as connection:
            rows = await connection.execute(
                sa.select(deployments, releases.c.envelope)
                .join(releases, releases.c.id == deployments.c.release_id)
                .where(deployments.c.state.in_(("scheduled", "running")))
                .order_by(deployments.c.created_at)
            )
            active = [dict(r._mapping) for r in rows]
        deadlines = []
        for deployment in active:
            deadline = await self._advance(deployment)
            if deadline is not None:
                deadlines.append(deadline)
        return min(deadlines, default=None)

    async def _advance(self, deployment: dict[str, Any]) -> float | None:
        """Move one deployment as far as it can go now."""
        changed = False
        policy = stored_policy(deployment)
        try:
            while True:
                if deployment["state"] == "scheduled":
                    deployment = await self._start_stage(deployment, 1)
                    changed = True
                if deployment["state"] != "running":  # paused or aborted by a person meanwhile
                    return None
                changed |= await self._send_queued(deployment)
                started = deployment["stage_started_at"]
                waiting = await self._count(deployment, ("queued", "sent"))
                if not policy.stage_over(waiting, started, time.time()):
                    return policy.deadline(started)
                deployment = await self._finish_stage(deployment, policy)
                changed = True
        finally:
            if changed:
                await self.changes.bump()

    async def _update(self, deployment: dict[str, Any], **changes: Any) -> dict[str, Any]:
        """Write ``changes`` only if nobody (a person pausing) changed the state meanwhile."""
        changes["updated_at"] = time.time()
        async with self.engine.begin() as connection:
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
        return {**deployment, **changes}

    async def _start_stage(self, deployment: dict[str, Any], stage: int) -> dict[str, Any]:
        log.info(
            "deployment %s: stage %d of %d", deployment["id"], stage, deployment["stage_count"]
        )
        return await self._update(
            deployment, state="running", stage=stage, stage_started_at=time.time()
        )

    async def _send_queued(self, deployment: dict[str, Any]) -> bool:
        sent_any = False
        while True:
            async with self.engine.connect() as connection:
                queued = await self._devices(connection, deployment, ("queued",), self.send_batch)
            if not queued:
                return sent_any
            group = deployment["group_name"]
            envelope, serial = self._envelope(deployment["envelope"], queued)
            # what they are sent is written first: a device may answer (and leave "queued")
            # before the batch is marked sent, and a crash re-sends these very bytes
            digest = hashlib.sha256(envelope).hexdigest()
            await self._mark(deployment, queued, envelope_sha256=digest, serial=serial)
            for device in queued:
                topic = Topics(self.prefix, group, device).device_release
                await self.publish(topic, envelope)
            await self._mark(deployment, queued, status="sent", sent_at=time.time())
            sent_any = True

    async def _mark(self, deployment: dict[str, Any], batch: list[str], **values: Any) -> None:
        """Write ``values`` on the rows of ``batch`` still queued."""
        async with self.engine.begin() as connection:
            await connection.execute(
                deployment_devices.update()
                .where(
                    deployment_devices.c.deployment_id == deployment["id"],
                    deployment_devices.c.device_id.in_(batch),
                    deployment_devices.c.status == "queued",
                )
                .values(**values)
            )

    def _envelope(self, uploaded: bytes, batch: list[str]) -> tuple[bytes, int]:
        """The envelope for ``batch`` and its serial (see the module docstring)."""
        manifest = parse_manifest(decode_envelope(uploaded, max_bytes=len(uploaded)).payload)
        if self.sign is None:
            return uploaded, manifest.serial
        return self.sign(stage_manifest(manifest, batch)), manifest.serial

    async def _finish_stage(
        self, deployment: dict[str, Any], policy: RolloutPolicy
    ) -> dict[str, Any]:
        """Time out the silent devices, then do what the policy's verdict says."""
        async with self.engine.begin() as connection:
            await connection.execute(
                deployment_devices.update()
                .where(
                    deployment_devices.c.deployment_id == deployment["id"],
                    deployment_devices.c.stage == deployment["stage"],
                    deployment_devices.c.status.in_(("queued", "sent")),
                )
                .values(status=TIMED_OUT, code=TIMED_OUT, answered_at=time.time())
            )
        tally = await self._tally(deployment)
        verdict = policy.verdict(deployment["stage"], deployment["stage_count"], tally)
        if verdict.state == "aborted":
            log.warning("deployment %s aborted: %s", deployment["id"], verdict.reason)
            return await self._update(deployment, state="aborted", reason=verdict.reason)
        if verdict.state == "succeeded":
            log.info("deployment %s succeeded (%d failed)", deployment["id"], tally.failed)
            return await self._update(deployment, state="succeeded")
        return await self._start_stage(deployment, deployment["stage"] + 1)

    async def _devices(
        self,
        connection: AsyncConnection,
        deployment: dict[str, Any],
        statuses: tuple[str, ...],
        limit: int,
    ) -> list[str]:
        rows = await connection.execute(
            sa.select(deployment_devices.c.device_id)
            .where(
                deployment_devices.c.deployment_id == deployment["id"],
                deployment_devices.c.stage == deployment["stage"],
                deployment_devices.c.status.in_(statuses),
            )
            .order_by(deployment_devices.c.device_id)
            .limit(limit)
        )
        return [r[0] for r in rows]

    async def _count(self, deployment: dict[str, Any], statuses: tuple[str, ...]) -> int:
        """Devices of the current stage in one of ``statuses``."""
        async with self.engine.connect() as connection:
            value = await connection.scalar(
                sa.select(sa.func.count()).where(
                    deployment_devices.c.deployment_id == deployment["id"],
                    deployment_devices.c.stage == deployment["stage"],
                    deployment_devices.c.status.in_(statuses),
                )
            )
        return int(value or 0)

    async def _tally(self, deployment: dict[str, Any]) -> Tally:
        """The finished devices of every stage up to the current one, by status."""
        status = deployment_devices.c.status
        async with self.engine.connect() as connection:
            rows = await connection.execute(
                sa.select(status, sa.func.count())
                .where(
                    deployment_devices.c.deployment_id == deployment["id"],
                    deployment_devices.c.stage <= deployment["stage"],
                    status.in_(FINISHED),
                )
                .group_by(status)
            )
            return Tally.of({name: int(count) for name, count in rows})
