"""The rollout controller: drives every running deployment from its rows, so it survives a crash.

Each pass reads the deployments that are ``scheduled`` or ``running`` and, for the current stage
k: sends the release to the stage's devices still ``queued``, one batch at a time — first it
commits what each device of the batch will be sent (the envelope's SHA-256 and serial), then
publishes, then marks them ``sent``; when the deployment's rollout policy (``hub/policy/``,
rebuilt from the row, the same rules ``hub rollout`` follows) says the stage is over — every
device answered, or its time-out from ``stage_started_at`` passed — the silent ones become
``timed_out`` and the policy's verdict on every finished device so far aborts the deployment
(its devices never sent become ``not_sent``), ends it (``succeeded``) or starts stage k+1.
Nothing lives only in memory: after a restart the first pass carries on where the rows say.

What a device is sent: with the hub's release key(s) (``hub server --release-key``) the
controller signs one envelope per batch of a stage (at most ``send_batch`` devices, well under
the manifest's ``MAX_TARGETS``), the uploaded manifest with ``targets.device_ids`` set to that
batch — what ``hub rollout`` does per stage — so a copy replayed to any other device is refused
there as ``wrong_target``, and with a serial of its own from the database's counter
(``releasedb.next_serial``), taken in the transaction that records it: above everything the
server sent before, so devices accept a rollback to an old release too. Without a key the
uploaded envelope goes out unchanged, after the server serial check (``releasedb.check_serial``;
a deployment that fails it is aborted before it sends anything more). An agent release is code,
which the server never signs: it always goes out as uploaded, after the same check, even from a
server with release keys (``_signer``).

Never twice: a batch published but not yet marked sent (the marking failed) is marked on the
next pass, not published again. Only a crash between publishing and marking re-sends — the
same bytes (the recorded serial, the batch's devices, the deployment's dates: Ed25519 is
deterministic), which a device that has it already refuses as ``same_version``.

Lock order: each write of device rows locks them first in (deployment, device id) order
(``deploydb.lock_devices``), the order the ingest writes answers in, so the two never deadlock
on PostgreSQL.

An aborted deployment (by its policy or by a person) is then cancelled once: its retained slot
cleared if it holds the release, and a signed cancellation sent behind the release to every
device that may hold it unanswered (``server.cancel``), so a device that was offline during
the abort does not install it when it comes back.

The controller only decides: what it reads comes from ``deployreads`` and every write is one
of ``deploydb``'s named transitions (``enter_stage``, ``record_batch``, ``mark_sent``,
``time_out_stage``, ``abort``, ``succeed``), in a transaction it opens. A deployment's release
is parsed once and kept while the deployment is active, not once per batch.

The controller sleeps until the nearest stage deadline or until ``wake()`` (a device answered,
a person acted, the broker reconnected).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from edgeagent.fleet.manifest import ReleaseManifest
from edgeagent.fleet.topics import Topics
from edgeagent.hub.policy import RolloutPolicy, stored_policy
from edgeagent.hub.release_checks import AnyRelease
from edgeagent.hub.rollout import stage_manifest
from edgeagent.hub.server import deploydb, deployreads
from edgeagent.hub.server.cancel import Canceller, ClearSlot, SignCancel
from edgeagent.hub.server.changes import Changes
from edgeagent.hub.server.releasedb import DeploymentError, next_serial, release_manifest

log = logging.getLogger(__name__)

Publish = Callable[[str, bytes], Awaitable[None]]
Sign = Callable[[ReleaseManifest], bytes]
RETRY_S = 5.0  # after a failed pass (broker or database away), unless woken sooner


@dataclasses.dataclass(frozen=True)
class Batch:
    """What one batch is sent, as recorded before it is published."""

    envelope: bytes
    sha256: str
    serial: int
    devices: list[str]  # the ones still to publish to


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
        sign_cancel: SignCancel | None = None,
        clear_slot: ClearSlot | None = None,
    ) -> None:
        self.engine = engine
        self.publish = publish
        self.prefix = prefix
        self.changes = changes  # bumped after every pass that changed a deployment
        self.send_batch = send_batch  # devices published to between two commits
        self.sign = sign  # the hub's release key(s); None: send the uploaded envelope
        self.canceller = Canceller(engine, publish, prefix, sign=sign_cancel, clear_slot=clear_slot)
        self._wake = asyncio.Event()
        # published but not yet marked sent: deployment → envelope SHA-256 → devices
        self._unmarked: dict[str, dict[str, list[str]]] = {}
        # each active deployment's release as it sends it (parsed once, its own dates)
        self._releases: dict[str, AnyRelease] = {}

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
        for deployment_id in list(self._unmarked):  # before anything could send them again
            await self._mark_unmarked(deployment_id)
        async with self.engine.connect() as connection:
            active = await deployreads.active_deployments(connection)
        for gone in self._releases.keys() - {deployment["id"] for deployment in active}:
            del self._releases[gone]
        deadlines = []
        for deployment in active:
            deadline = await self._advance(deployment)
            if deadline is not None:
                deadlines.append(deadline)
        if await self.canceller.run_once():
            await self.changes.bump()
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
                deployment, sent = await self._send_queued(deployment)
                changed |= sent
                if deployment["state"] != "running":  # refused by the serial check
                    return None
                started = deployment["stage_started_at"]
                async with self.engine.connect() as connection:
                    waiting = await deployreads.waiting_count(connection, deployment)
                if not policy.stage_over(waiting, started, time.time()):
                    return policy.deadline(started)
                deployment = await self._finish_stage(deployment, policy)
                changed = True
        finally:
            if changed:
                await self.changes.bump()

    async def _start_stage(self, deployment: dict[str, Any], stage: int) -> dict[str, Any]:
        log.info(
            "deployment %s: stage %d of %d", deployment["id"], stage, deployment["stage_count"]
        )
        async with self.engine.begin() as connection:
            return await deploydb.enter_stage(connection, deployment, stage)

    async def _send_queued(self, deployment: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """Send every queued device of the stage; returns the deployment (aborted if the serial
        check refused it) and whether anything changed."""
        sent_any = False
        while True:
            async with self.engine.begin() as connection:
                batch = await self._next_batch(connection, deployment)
            if batch is None:
                return deployment, sent_any
            if isinstance(batch, str):  # the server serial check refused it: nothing sent
                log.warning("deployment %s aborted: %s", deployment["id"], batch)
                async with self.engine.begin() as connection:
                    return await deploydb.abort(connection, deployment, batch), True
            group = deployment["group_name"]
            unmarked = self._unmarked.setdefault(deployment["id"], {})
            published = unmarked.setdefault(batch.sha256, [])
            for device in batch.devices:
                topic = Topics(self.prefix, group, device).device_release
                await self.publish(topic, batch.envelope)
                published.append(device)
            await self._mark_unmarked(deployment["id"])
            sent_any = True

    async def _next_batch(
        self, connection: AsyncConnection, deployment: dict[str, Any]
    ) -> Batch | str | None:
        """The next batch of the stage with what it is sent, recorded on its rows in this
        transaction (a reason instead when the serial check refuses it; None: all sent).

        Devices recorded but still queued (a crash or the broker away after the record) come
        first, with the very bytes recorded for them; then the next ``send_batch`` devices
        never recorded, with a fresh serial when the server signs."""
        claim = await deploydb.claim_batch(connection, deployment, self.send_batch)
        if claim is None:
            return None
        if claim.sha256 is not None and claim.serial is not None:
            batch = self._recorded_batch(deployment, claim)
            if batch is not None:
                return batch
        sign = self._signer(deployment)
        if sign is None:
            try:
                serial = await deploydb.relay_serial(
                    connection, deployment, self._release(deployment)
                )
            except DeploymentError as exc:
                return exc.message
            envelope = deployment["envelope"]
        else:
            serial = await next_serial(connection, deployment["model"])
            envelope = self._signed(sign, deployment, serial, claim.devices)
        sha256 = hashlib.sha256(envelope).hexdigest()
        await deploydb.record_batch(connection, deployment["id"], claim.devices, sha256, serial)
        return Batch(envelope, sha256, serial, claim.devices)

    def _recorded_batch(self, deployment: dict[str, Any], claim: deploydb.Claim) -> Batch | None:
        """The recorded envelope again, for the claimed devices (queued) of it; None if this
        server cannot make those bytes any more (restarted with other keys, or without)."""
        assert claim.sha256 is not None and claim.serial is not None
        sign = self._signer(deployment)
        if sign is None:
            envelope = deployment["envelope"]
        else:
            envelope = self._signed(sign, deployment, claim.serial, list(claim.batch))
        if hashlib.sha256(envelope).hexdigest() != claim.sha256:
            log.warning(
                "deployment %s: the envelope recorded for %d device(s) cannot be made again "
                "(other release keys?): sending them a new one",
                deployment["id"],
                len(claim.devices),
            )
            return None
        return Batch(envelope, claim.sha256, claim.serial, claim.devices)

    def _signer(self, deployment: dict[str, Any]) -> Sign | None:
        """The hub's release key(s) for a model release; None (relay the upload) without them
        and for an agent release, whatever keys the server holds: it never signs code."""
        return self.sign if deployment["kind"] == "model" else None

    def _signed(
        self, sign: Sign, deployment: dict[str, Any], serial: int, devices: list[str]
    ) -> bytes:
        """The model release signed with ``serial`` for exactly ``devices`` (one batch)."""
        manifest = self._release(deployment)
        assert isinstance(manifest, ReleaseManifest), "the server signs model releases only"
        return sign(stage_manifest(dataclasses.replace(manifest, serial=serial), devices))

    def _release(self, deployment: dict[str, Any]) -> AnyRelease:
        """The uploaded manifest, with the deployment's own dates if it re-issues it; parsed
        once per deployment (kept while it is active), not once per batch."""
        cached = self._releases.get(deployment["id"])
        if cached is not None:
            return cached
        manifest = release_manifest(deployment["envelope"])
        if deployment.get("issued_at") is not None and deployment.get("expires") is not None:
            manifest = dataclasses.replace(
                manifest,
                issued_at=datetime.fromtimestamp(deployment["issued_at"], timezone.utc),
                expires=datetime.fromtimestamp(deployment["expires"], timezone.utc),
            )
        self._releases[deployment["id"]] = manifest
        return manifest

    async def _mark_unmarked(self, deployment_id: str) -> None:
        """Mark what was published as sent (rows an abort made ``not_sent`` meanwhile too);
        forgotten only once that is committed."""
        for sha256, devices in list(self._unmarked.get(deployment_id, {}).items()):
            if devices:
                async with self.engine.begin() as connection:
                    await deploydb.mark_sent(connection, deployment_id, sha256, devices)
            del self._unmarked[deployment_id][sha256]
        self._unmarked.pop(deployment_id, None)

    async def _finish_stage(
        self, deployment: dict[str, Any], policy: RolloutPolicy
    ) -> dict[str, Any]:
        """Time out the silent devices, then do what the policy's verdict says."""
        async with self.engine.begin() as connection:
            await deploydb.time_out_stage(connection, deployment)
        async with self.engine.connect() as connection:
            tally = await deployreads.tally(connection, deployment)
        verdict = policy.verdict(deployment["stage"], deployment["stage_count"], tally)
        if verdict.state == "aborted":
            log.warning("deployment %s aborted: %s", deployment["id"], verdict.reason)
            async with self.engine.begin() as connection:
                return await deploydb.abort(connection, deployment, verdict.reason)
        if verdict.state == "succeeded":
            log.info("deployment %s succeeded (%d failed)", deployment["id"], tally.failed)
            async with self.engine.begin() as connection:
                return await deploydb.succeed(connection, deployment)
        return await self._start_stage(deployment, deployment["stage"] + 1)
