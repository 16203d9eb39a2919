"""One camera's pipeline: frames from its source → the detector (through the engine's data
plane, at the stream's priority) → masks and zones → the tracker → an optional classifier on
each new track's crop → events, snapshots and Home Assistant states.

A frame older than ``max_frame_age_s`` is never processed (counted as stale): its remaining
age is also the engine deadline of its detection, so a queue in the batcher cannot make it old
either. Streams run at a lower priority than interactive requests, so the governor sheds them
first and an HTTP client never waits behind a camera.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from typing import Any, Protocol

from edgeagent.engine.errors import ServingError
from edgeagent.models.detector import detections_json
from edgeagent.models.package import ModelPackage
from edgeagent.streams import discovery
from edgeagent.streams.events import Outbox
from edgeagent.streams.frames import Frame, FrameSlot
from edgeagent.streams.settings import StreamSettings
from edgeagent.streams.snapshots import SnapshotStore
from edgeagent.streams.source import Source
from edgeagent.streams.tracker import Changes, Detection, Track, Tracker, anchor, inside

log = logging.getLogger(__name__)


class Detector(Protocol):
    """What a pipeline needs of the engine (``engine.dataplane.DataPlane``)."""

    async def detect_frame(
        self,
        name: str,
        image: Any,
        *,
        min_score: float | None = None,
        priority: int | None = None,
        timeout_s: float | None = None,
    ) -> tuple[ModelPackage, Any]: ...

    async def classify_frame(
        self, name: str, image: Any, *, priority: int | None = None
    ) -> tuple[str, float]: ...


def sealed(package: ModelPackage) -> bool:
    """Whether any variant of the detector is sealed (its snapshots are sealed too)."""
    return any(variant.sealed_files for variant in package.variants)


def wanted(
    found: list[dict[str, Any]], settings: StreamSettings, size: tuple[int, int]
) -> list[Detection]:
    """The detections the tracker sees: of the stream's ``labels`` (all when empty), and not
    standing in any of its ``masks``."""
    kept = []
    for d in found:
        box = (d["box"][0], d["box"][1], d["box"][2], d["box"][3])
        if settings.labels and d["label"] not in settings.labels:
            continue
        if any(inside(anchor(box, size), mask) for mask in settings.masks):
            continue
        kept.append(Detection(d["label"], d["score"], box))
    return kept


class Pipeline:
    """A source and the task that processes its frames."""

    def __init__(
        self,
        settings: StreamSettings,
        detector: Detector,
        outbox: Outbox,
        snapshots: SnapshotStore | None,
        discovery_prefix: str | None,
    ) -> None:
        self.settings = settings
        self.detector = detector
        self.outbox = outbox
        self.snapshots = snapshots
        self.discovery_prefix = discovery_prefix
        self.slot = FrameSlot(settings.frame_slots, asyncio.get_running_loop())
        self.source = Source(settings, self.slot)
        self.tracker = Tracker(settings.iou_threshold, settings.min_hits, settings.max_missed)
        self.processed = 0
        self.stale = 0  # frames too old to process
        self.failed = 0  # detections the engine refused (busy, shed, timed out, no model)
        self.last_error = ""
        self.max_processed_age_s = 0.0
        self.events = Counter[str]()
        self._announced: set[str] = set()
        self._last_update: dict[int, tuple[float, float, tuple[str, ...]]] = {}
        self._task: asyncio.Task | None = None

    # -- lifecycle ------------------------------------------------------------------------

    def start(self) -> None:
        self._announce(discovery.PRESENCE_LABEL)
        self.source.start()
        self._task = asyncio.get_running_loop().create_task(
            self._run(), name=f"stream-{self.settings.name}"
        )

    async def stop(self) -> None:
        """Stop the source, the task, and end every live track (their end events)."""
        await asyncio.to_thread(self.source.stop)
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for track in self.tracker.end_all():
            await self._emit("end", track, time.time())
        self._publish_counts()

    def status(self) -> dict[str, Any]:
        return {
            **self.source.status(),
            "model": self.settings.model,
            "frames_processed": self.processed,
            "frames_stale": self.stale,
            "detections_failed": self.failed,
            "last_error": self.last_error,
            "max_processed_age_s": round(self.max_processed_age_s, 3),
            "tracks": len([t for t in self.tracker.tracks if t.confirmed]),
            "events": dict(self.events),
        }

    # -- the loop -------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            frame = await self.slot.get()
            try:
                await self._process(frame)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug on one frame must not end the camera
                log.exception("stream %s: processing a frame failed", self.settings.name)

    async def _process(self, frame: Frame) -> None:
        s = self.settings
        age = time.time() - frame.captured_at
        if age > s.max_frame_age_s:
            self.stale += 1
            return
        try:
            package, found = await self.detector.detect_frame(
                s.model,
                frame.image,
                min_score=s.min_score / 2,  # the tracker's second stage keeps the weaker ones
                priority=s.priority,
                timeout_s=s.max_frame_age_s - age,
            )
        except ServingError as exc:
            self.failed += 1
            if str(exc) != self.last_error:
                log.warning("stream %s: detection failed: %s", s.name, exc)
            self.last_error = str(exc)
            return
        self.max_processed_age_s = max(self.max_processed_age_s, time.time() - frame.captured_at)
        self.processed += 1
        detections = wanted(detections_json(package, found), s, frame.image.size)
        changes = self.tracker.update(detections, s.min_score)
        await self._events(changes, frame, package)

    async def _events(self, changes: Changes, frame: Frame, package: ModelPackage) -> None:
        s, size = self.settings, frame.image.size
        for track in [*changes.started, *changes.seen]:
            point = anchor(track.box, size)
            track.zones = tuple(name for name, zone in s.zones.items() if inside(point, zone))
        for track in changes.started:
            if s.classifier:
                await self._classify(track, frame)
            if s.snapshots and self.snapshots is not None:
                await self._snapshot(track, frame, package)
            self._announce(track.label)
            await self._emit("start", track, frame.captured_at)
        for track in changes.seen:
            last = self._last_update.get(track.id)
            if last is None:
                continue
            at, score, zones = last
            changed = track.score > score + 0.05 or track.zones != zones
            if changed and frame.captured_at - at >= s.update_interval_s:
                await self._emit("update", track, frame.captured_at)
        for track in changes.ended:
            await self._emit("end", track, frame.captured_at)
        if changes.started or changes.ended:
            self._publish_counts()

    async def _snapshot(self, track: Track, frame: Frame, package: ModelPackage) -> None:
        """The frame as a JPEG beside the start event; a full disk costs the picture, never
        the event."""
        name = f"{self.settings.name}-{int(frame.captured_at * 1000)}-{track.id}"
        try:
            track.extra["snapshot"] = await asyncio.to_thread(
                self.snapshots.save,  # type: ignore[union-attr]
                name,
                frame.image,
                sealed(package),
            )
        except OSError as exc:
            self.last_error = f"snapshot: {exc}"
            log.warning("stream %s: snapshot not kept: %s", self.settings.name, exc)

    async def _classify(self, track: Track, frame: Frame) -> None:
        box = tuple(round(v) for v in track.box)
        crop = frame.image.crop(box)  # type: ignore[arg-type]
        try:
            label, score = await self.detector.classify_frame(
                self.settings.classifier, crop, priority=self.settings.priority
            )
        except ServingError as exc:
            self.last_error = f"classifier: {exc}"
            return
        track.extra["sub_label"] = label
        track.extra["sub_label_score"] = round(score, 4)

    async def _emit(self, kind: str, track: Track, captured_at: float) -> None:
        if kind == "end":
            self._last_update.pop(track.id, None)
        else:
            self._last_update[track.id] = (captured_at, track.score, track.zones)
        self.events[kind] += 1
        await self.outbox.event(
            self.settings.name,
            kind,
            {
                "track_id": track.id,
                "label": track.label,
                "score": round(track.score, 4),
                "best_score": round(track.best_score, 4),
                "box": [round(v, 1) for v in track.box],
                "zones": list(track.zones),
                "captured_at": round(captured_at, 3),
                "snapshot": track.extra.get("snapshot"),
                **{k: v for k, v in track.extra.items() if k != "snapshot"},
            },
        )

    def _announce(self, label: str) -> None:
        """Count ``label`` on this stream from now on (and its Home Assistant discovery), once."""
        if label in self._announced:
            return
        self._announced.add(label)
        self._publish_counts()
        if self.discovery_prefix is None:
            return
        topics = self.outbox.topics
        configs = [discovery.count_config(self.discovery_prefix, topics, self.settings.name, label)]
        if label == discovery.PRESENCE_LABEL:
            configs.append(
                discovery.presence_config(self.discovery_prefix, topics, self.settings.name)
            )
        for topic, payload in configs:
            self.outbox.retain(topic.name, payload)

    def _publish_counts(self) -> None:
        live = Counter(t.label for t in self.tracker.tracks if t.confirmed)
        topics, name = self.outbox.topics, self.settings.name
        for label in self._announced:
            self.outbox.retain(topics.stream(name, "count", label).name, str(live[label]))
        if discovery.PRESENCE_LABEL in self._announced:
            present = "ON" if live[discovery.PRESENCE_LABEL] else "OFF"
            self.outbox.retain(
                topics.stream(name, "presence", discovery.PRESENCE_LABEL).name, present
            )
