"""What an abort sends: the cancellation of every release the deployment may have queued.

Aborting stops the controller sending, but a device that was offline when its release was
published holds it in its persistent MQTT session and would install it when it comes back
(AWS IoT Jobs cancels such queued executions of a cancelled job). So for each ``aborted``
deployment the controller, once (``deployments.cancelled_at``; a crash before it is recorded
sends it again, which devices take as the same word):

1. clears the group's retained slot of the model if it holds this release (``hub publish`` put
   it there; devices joining later would install it) — another release there stays;
2. signs a cancellation (``fleet.cancel``) covering the release's ``deployment_id`` up to the
   highest serial this deployment sent, valid until the release expires, and publishes it
   (QoS 1) on the release topic of every device an envelope was recorded for that has not
   answered: it lands behind the release in an offline device's session, and the device
   refuses that release (``cancelled``), which it reports when it is back
   (``deploydb.late_answer``). Its one write, that the cancellation went out, is
``deploydb.mark_cancelled``.

A cancellation needs the release key(s) the server signs with (``--release-key``): one that
only relays uploads cannot sign one, nor is one ever signed for an agent release (code the
server never signs). Then only the slot is cleared, and the log says that devices offline
during the abort may still install what they hold; their answers are recorded all the same.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from typing import Any

from sqlalchemy.ext.asyncio import AsyncEngine

from edgeagent.fleet.cancel import Cancellation
from edgeagent.fleet.manifest import ReleaseManifest
from edgeagent.fleet.topics import DeviceTopics
from edgeagent.hub.server import deploydb, deployreads
from edgeagent.hub.server.leadership import Leadership
from edgeagent.hub.server.releasedb import release_manifest

log = logging.getLogger(__name__)

Publish = Callable[[str, bytes], Awaitable[None]]
SignCancel = Callable[[Cancellation], bytes]
ClearSlot = Callable[[str, str, str], Awaitable[bool]]  # (group, model, deployment_id)


class Canceller:
    """Sends each aborted deployment's cancellation once (module docstring)."""

    def __init__(
        self,
        engine: AsyncEngine,
        publish: Publish,
        prefix: str,
        *,
        leadership: Leadership,
        sign: SignCancel | None = None,
        clear_slot: ClearSlot | None = None,
    ) -> None:
        self.engine = engine
        self.leadership = leadership  # its token fences the write; checked before publishing
        self.publish = publish
        self.prefix = prefix
        self.sign = sign
        self.clear_slot = clear_slot

    async def run_once(self) -> bool:
        """Cancel every aborted deployment not cancelled yet; whether any was."""
        async with self.engine.connect() as connection:
            aborted = await deployreads.aborted_uncancelled(connection)
        for deployment in aborted:
            await self._cancel(deployment)
        return bool(aborted)

    async def _cancel(self, deployment: dict[str, Any]) -> None:
        manifest = release_manifest(deployment["envelope"])
        if isinstance(manifest, ReleaseManifest):
            group, tag = deployment["group_name"], manifest.deployment_id
            slot = self.clear_slot
            if group and slot is not None and await slot(group, manifest.model, tag):
                log.info(
                    "deployment %s: cleared the release of %s retained in group %s",
                    deployment["id"],
                    manifest.model,
                    group,
                )
            await self._send(deployment, manifest)
        async with self.engine.begin() as connection:
            await deploydb.mark_cancelled(
                connection, deployment["id"], token=self.leadership.check()
            )

    async def _send(self, deployment: dict[str, Any], manifest: ReleaseManifest) -> None:
        """The signed cancellation to every device that may hold the release unanswered."""
        async with self.engine.connect() as connection:
            devices, serial = await deployreads.unanswered(connection, deployment["id"])
        expires = deployment["expires"] or manifest.expires.timestamp()
        now = int(time.time())  # manifests carry whole seconds
        if not devices or serial is None or expires <= now:
            return  # nothing queued, or only releases that expired: devices refuse those
        if self.sign is None:
            log.warning(
                "deployment %s aborted: %d device(s) may hold its release unanswered and "
                "install it when they come back; only a server with --release-key can "
                "cancel it (a model release)",
                deployment["id"],
                len(devices),
            )
            return
        envelope = self.sign(
            Cancellation(
                model=manifest.model,
                deployment_id=manifest.deployment_id,
                serial=serial,
                issued_at=datetime.fromtimestamp(now, timezone.utc),
                expires=datetime.fromtimestamp(expires, timezone.utc),
                reason=deployment["reason"],
            )
        )
        for device in devices:
            self.leadership.check()  # a replica paused past its lease sends nothing more
            await self.publish(DeviceTopics(self.prefix, device).release.name, envelope)
        log.info("deployment %s: cancellation sent to %d device(s)", deployment["id"], len(devices))
