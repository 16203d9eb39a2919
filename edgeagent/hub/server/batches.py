"""Sending a running stage's release to its queued devices, one batch at a time, never twice.

What a device is sent: with the hub's release key(s) (``hub server --release-key``) the
sender signs one envelope per batch of a stage (at most ``send_batch`` devices, well under the
manifest's ``MAX_TARGETS``), the uploaded manifest with ``targets.device_ids`` set to that
batch — what ``hub rollout`` does per stage — so a copy replayed to any other device is refused
there as ``wrong_target``, and with a serial of its own from the database's counter
(``releasedb.next_serial``), taken in the transaction that records it: above everything the
server sent before, so devices accept a rollback to an old release too. Without a key the
uploaded envelope goes out unchanged, after the server serial check (``releasedb.check_serial``;
a deployment that fails it is aborted before it sends anything more). An agent release is code,
which the server never signs: it always goes out as uploaded, after the same check, even from a
server with release keys (``_signer``).

Each batch: first it commits what each device of the batch will be sent (the envelope's
SHA-256 and serial); then, device by device, one transaction fences (the controller's token,
``leadership.fence``: refused when a newer controller holds the lease, and no takeover can
commit until this transaction ends), checks that the lease surely still holds by this
process's clock, publishes, and marks the device ``sent`` before it commits. A device published
but not yet marked (the marking failed) is marked on the next pass, not published again. Only a
crash between a publish and its commit re-sends, to that one device — the same bytes (the
recorded serial, the batch's devices, the deployment's dates: Ed25519 is deterministic), which
a device that has it already refuses as ``same_version``. A replica paused in that window
publishes the one message it held when it wakes (``leadership``'s docstring), and nothing after.

A deployment's release is parsed once and kept while the deployment is active, not once per
batch. Every write is one of ``deploydb``'s transitions (``claim_batch``, ``record_batch``,
``mark_sent``, ``abort``), each with the fencing token; which stage is sent is the
controller's decision.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from collections.abc import Awaitable, Callable, Collection
from datetime import datetime, timezone
from typing import Any

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from edgeagent.fleet.manifest import ReleaseManifest
from edgeagent.fleet.topics import Topics
from edgeagent.hub.release_checks import AnyRelease
from edgeagent.hub.rollout import stage_manifest
from edgeagent.hub.server import deploydb
from edgeagent.hub.server.leadership import Leadership, fence
from edgeagent.hub.server.releasedb import DeploymentError, next_serial, release_manifest
from edgeagent.hub.server.stage_windows import stage_window

log = logging.getLogger(__name__)

Publish = Callable[[str, bytes], Awaitable[None]]
Sign = Callable[[ReleaseManifest], bytes]


@dataclasses.dataclass(frozen=True)
class Batch:
    """What one batch is sent, as recorded before it is published."""

    envelope: bytes
    sha256: str
    serial: int
    devices: list[str]  # the ones still to publish to


class BatchSender:
    """One per controller. ``publish`` sends one QoS 1 message (raises when the broker is down);
    ``sign`` is the hub's release key(s), None: send the uploaded envelope; ``leadership``
    gives the fencing token of every write and says whether the lease still holds."""

    def __init__(
        self,
        engine: AsyncEngine,
        publish: Publish,
        prefix: str,
        *,
        send_batch: int,
        sign: Sign | None,
        leadership: Leadership,
    ) -> None:
        self.engine = engine
        self.publish = publish
        self.prefix = prefix
        self.send_batch = send_batch  # devices one envelope is recorded (and signed) for
        self.leadership = leadership
        self.sign = sign
        # published but not yet marked sent: deployment → envelope SHA-256 → devices
        self._unmarked: dict[str, dict[str, list[str]]] = {}
        # each active deployment's release as it sends it (parsed once, its own dates)
        self._releases: dict[str, AnyRelease] = {}

    async def mark_unmarked(self) -> None:
        """Mark every batch published but not yet marked ``sent`` (the marking failed)."""
        for deployment_id in list(self._unmarked):
            await self._mark(deployment_id)

    def keep_releases_of(self, active: Collection[str]) -> None:
        """Forget the parsed releases of deployments no longer active."""
        for gone in self._releases.keys() - set(active):
            del self._releases[gone]

    async def send_queued(self, deployment: dict[str, Any]) -> tuple[dict[str, Any], bool]:
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
                    aborted = await deploydb.abort(
                        connection, deployment, batch, token=self.leadership.check()
                    )
                    return aborted, True
            for device in batch.devices:
                await self._send_one(deployment, batch, device)
            sent_any = True

    async def _send_one(self, deployment: dict[str, Any], batch: Batch, device: str) -> None:
        """Publish to one device and mark it sent, in one fenced transaction (module
        docstring); a publish whose marking failed is remembered and marked next pass."""
        topic = Topics(self.prefix, deployment["group_name"], device).device_release
        unmarked = self._unmarked.setdefault(deployment["id"], {}).setdefault(batch.sha256, [])
        async with self.engine.begin() as connection:
            token = self.leadership.check()
            await fence(connection, token)
            self.leadership.check()  # the fence may have waited: the lease must still hold
            await self.publish(topic, batch.envelope)
            unmarked.append(device)
            await deploydb.mark_sent(
                connection, deployment["id"], batch.sha256, [device], token=token
            )
        unmarked.remove(device)

    async def _next_batch(
        self, connection: AsyncConnection, deployment: dict[str, Any]
    ) -> Batch | str | None:
        """The next batch of the stage with what it is sent, recorded on its rows in this
        transaction (a reason instead when the serial check refuses it; None: all sent).

        Devices recorded but still queued (a crash or the broker away after the record) come
        first, with the very bytes recorded for them; then the next ``send_batch`` devices
        never recorded, with a fresh serial when the server signs."""
        token = self.leadership.check()
        await fence(connection, token)  # before any row is locked: a takeover waits for us
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
        await deploydb.record_batch(
            connection, deployment["id"], claim.devices, sha256, serial, token=token
        )
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
        """The model release signed with ``serial`` for exactly ``devices`` (one batch), in
        its stage's maintenance window where the deployment gives the stage one."""
        manifest = self._release(deployment)
        assert isinstance(manifest, ReleaseManifest), "the server signs model releases only"
        release = dataclasses.replace(manifest, serial=serial)
        return sign(stage_manifest(release, devices, stage_window(deployment)))

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

    async def _mark(self, deployment_id: str) -> None:
        """Mark what was published as sent (rows an abort made ``not_sent`` meanwhile too);
        forgotten only once that is committed."""
        for sha256, devices in list(self._unmarked.get(deployment_id, {}).items()):
            if devices:
                async with self.engine.begin() as connection:
                    await deploydb.mark_sent(
                        connection, deployment_id, sha256, devices, token=self.leadership.check()
                    )
            del self._unmarked[deployment_id][sha256]
        self._unmarked.pop(deployment_id, None)
