"""The cameras as one daemon service: a pipeline per ``[[stream]]``, one outbox, one snapshot
store; ``apply`` swaps in a reloaded list (only the streams whose table changed restart)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeagent.aio import cancel_and_wait, spawn
from edgeagent.fleet.mqtt import MqttLink
from edgeagent.fleet.settings import MqttSettings
from edgeagent.fleet.topics import DeviceTopics, Topics
from edgeagent.streams.events import Link, Outbox
from edgeagent.streams.pipeline import Detector, Pipeline
from edgeagent.streams.settings import StreamSettings, StreamsSettings
from edgeagent.streams.snapshots import SnapshotStore
from edgeagent.streams.spool import EventSpool

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

log = logging.getLogger(__name__)


async def _ignore_message(topic: str, payload: bytes) -> None:
    """The cameras' own MQTT link (updates off) acts on no message it receives."""


class StreamsService:
    """Starts, reconfigures and stops every camera pipeline."""

    def __init__(
        self,
        settings: StreamsSettings,
        streams: tuple[StreamSettings, ...],
        *,
        detector: Detector,
        topics: DeviceTopics,
        link: Link | None,
        own_link: bool = False,
        state_dir: Path,
        recipient: Callable[[], X25519PublicKey] | None = None,
    ) -> None:
        self.settings = settings
        self.wanted = streams
        self.detector = detector
        self.topics = topics
        self.link = link
        self.own_link = own_link  # run (and close) it here: no updater runs one
        self.state_dir = state_dir
        self.recipient = recipient
        self.pipelines: dict[str, Pipeline] = {}
        self.outbox: Outbox | None = None
        self.snapshots: SnapshotStore | None = None
        self._tasks: list[asyncio.Task] = []

    @classmethod
    def on_link(
        cls,
        settings: StreamsSettings,
        streams: tuple[StreamSettings, ...],
        *,
        detector: Detector,
        link: MqttLink | None,
        mqtt: MqttSettings,
        topics: Topics,
        state_dir: Path,
        recipient: Callable[[], X25519PublicKey] | None = None,
    ) -> StreamsService:
        """The cameras on the updater's MQTT ``link``; without one (updates off), on a link of
        their own (same ``[mqtt]`` settings) when any camera is configured at start."""
        own_link = link is None and bool(streams)
        if own_link:
            link = MqttLink(mqtt, topics, _ignore_message)
        return cls(
            settings,
            streams,
            detector=detector,
            topics=topics.of_device,
            link=link,
            own_link=own_link,
            state_dir=state_dir,
            recipient=recipient,
        )

    async def start(self) -> None:
        s, base = self.settings, self.state_dir / "streams"
        spool = EventSpool(s.spool_dir or base / "spool", s.spool_max_events, s.spool_max_bytes)
        self.outbox = Outbox(spool, self.topics, self.link)
        self.snapshots = SnapshotStore(
            s.snapshot_dir or base / "snapshots",
            s.snapshot_max_bytes,
            s.snapshot_max_age_s,
            s.snapshot_quality,
            self.recipient,
        )
        self._tasks = [spawn(self.outbox.run(), name="stream-outbox")]
        if self.own_link and self.link is not None:
            self._tasks.append(spawn(self.link.run(), name="stream-mqtt-link"))
        await self.apply(self.wanted)

    async def apply(self, streams: tuple[StreamSettings, ...]) -> None:
        """Run exactly ``streams``: removed or changed ones stop (their tracks end), new or
        changed ones start, unchanged ones keep running."""
        self.wanted = streams
        if self.outbox is None:
            return  # not started yet: start() applies it
        wanted = {stream.name: stream for stream in streams}
        for name, pipeline in list(self.pipelines.items()):
            if wanted.get(name) != pipeline.settings:
                await pipeline.stop()
                del self.pipelines[name]
                log.info("stream %s stopped", name)
        prefix = self.settings.discovery_prefix if self.settings.discovery else None
        for name, stream in wanted.items():
            if name not in self.pipelines:
                pipeline = Pipeline(stream, self.detector, self.outbox, self.snapshots, prefix)
                pipeline.start()
                self.pipelines[name] = pipeline
                log.info("stream %s started (%s, %s)", name, stream.kind, stream.model)

    async def stop(self) -> None:
        for pipeline in self.pipelines.values():
            await pipeline.stop()
        self.pipelines.clear()
        if self.own_link and self.link is not None:
            await self.link.close()
        await cancel_and_wait(self._tasks)
        self._tasks = []

    def status(self) -> dict[str, Any]:
        """The ``streams`` section of /v1/status."""
        return {
            "streams": {name: p.status() for name, p in self.pipelines.items()},
            "events": self.outbox.status() if self.outbox else None,
            "snapshots": self.snapshots.status() if self.snapshots else None,
        }
