"""Capture on the device: the data-plane hook, its bounded queue and the worker behind it.

``Capture.hook`` runs on the event loop right after a request was answered: it asks the rules
(numbers only) and puts the event in a bounded queue, or counts why it did not — a full queue
is a drop, never a wait, so capture adds no latency to any request. The worker takes events
one at a time: redaction (the operator's detector, through the data plane as an internal
request), then shrink, JPEG-encode, seal and write in a worker thread, each step audited.
A frame whose redaction fails is refused, never stored unblurred.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client import Counter as PromCounter

from edgeagent.aio import cancel_and_wait, spawn
from edgeagent.capture.audit import AuditLog
from edgeagent.capture.imaging import frame_jpeg, prepare
from edgeagent.capture.rules import Rules
from edgeagent.capture.settings import CaptureSettings
from edgeagent.capture.spool import Spool, SpoolFull, new_sample_id
from edgeagent.engine.hooks import InferenceEvent

log = logging.getLogger(__name__)

CAPTURE_DIR = "capture"
SPOOL_DIR = "spool"
# image bytes → the detector's answer (detections JSON), as the data plane gives it
Detector = Callable[[bytes], Awaitable[dict[str, Any]]]
CAPTURED = "captured"
QUEUE_FULL = "queue_full"
DISK_FULL = "disk_full"
REDACTION_FAILED = "redaction_failed"
UNREADABLE = "unreadable"


class CaptureMetrics:
    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.outcomes = PromCounter(
            "edgeagent_capture_outcomes",
            "Answered image requests seen by capture, by model and outcome (captured, or why "
            "not: a rule, a cap, queue_full, disk_full, redaction_failed)",
            ["model", "outcome"],
            registry=registry,
        )
        self.spool_bytes = Gauge(
            "edgeagent_capture_spool_bytes", "Sealed samples on disk", registry=registry
        )


def capture_dir(state_dir: Path) -> Path:
    return Path(state_dir) / CAPTURE_DIR


class Capture:
    """The capture hook and worker of one agent (see the module docstring)."""

    def __init__(
        self,
        settings: CaptureSettings,
        state_dir: Path,
        key: Callable[[], bytes],
        *,
        device_id: str,
        detector: Detector | None = None,
        metrics: CollectorRegistry | None = None,
        rules: Rules | None = None,
    ) -> None:
        self.settings = settings
        self.device_id = device_id
        root = capture_dir(state_dir)
        self.spool = Spool(root / SPOOL_DIR, key, int(settings.max_disk_mib * 1024 * 1024))
        self.audit = AuditLog(root)
        self.rules = rules or Rules(settings)
        self._detector = detector
        self._metrics = CaptureMetrics(metrics)
        self._queue: asyncio.Queue[InferenceEvent] = asyncio.Queue(settings.queue_size)
        self._counts: Counter[str] = Counter()
        self._task: asyncio.Task | None = None
        self._idle = asyncio.Event()
        self._idle.set()

    # ---- on the request's loop: numbers only ------------------------------------------------

    def hook(self, event: InferenceEvent) -> None:
        """The data-plane hook: keep, or count why not (never waits)."""
        reason = self.rules.decide(event, event.capture)
        if reason is None:
            try:
                self._queue.put_nowait(event)
                self._idle.clear()
                return
            except asyncio.QueueFull:
                reason = QUEUE_FULL
        self._count(event.model, reason)

    def _count(self, model: str, outcome: str) -> None:
        self._counts[outcome] += 1
        self._metrics.outcomes.labels(model, outcome).inc()

    # ---- the worker -------------------------------------------------------------------------

    async def start(self) -> None:
        self._sweep()
        self._task = spawn(self._run(), name="capture")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])
            self._task = None

    async def drained(self) -> None:
        """Wait until every queued event has been stored or refused (tests, benches)."""
        await self._idle.wait()

    async def _run(self) -> None:
        sweep_every = min(600.0, self.settings.retention_days * 86400 / 10)
        last_sweep = time.monotonic()
        while True:
            try:
                event = await asyncio.wait_for(self._queue.get(), timeout=sweep_every)
            except TimeoutError:
                event = None
            if event is not None:
                try:
                    await self._take(event)
                except Exception:  # one bad frame must not end capture
                    log.exception("capture of a %s frame failed", event.model)
                    self._count(event.model, UNREADABLE)
                if self._queue.empty():
                    self._idle.set()
            if time.monotonic() - last_sweep >= sweep_every:
                await asyncio.to_thread(self._sweep)
                last_sweep = time.monotonic()

    async def _take(self, event: InferenceEvent) -> None:
        image = event.image
        if not isinstance(image, bytes):  # a decoded frame: encoded now that it is kept
            image = await asyncio.to_thread(frame_jpeg, image)
        blur: list[list[float]] = []
        if self.settings.redact_detector:
            try:
                blur = await self._regions(image)
            except Exception as exc:
                log.warning("redaction of a %s frame failed (%s): not stored", event.model, exc)
                self.audit.record("refused", model=event.model, reason=f"redaction: {exc}")
                self._count(event.model, REDACTION_FAILED)
                return
        outcome = await asyncio.to_thread(self._store, event, image, blur)
        self._count(event.model, outcome)

    async def _regions(self, image: bytes) -> list[list[float]]:
        if self._detector is None:
            raise RuntimeError(f"detector {self.settings.redact_detector!r} is not available")
        answer = await self._detector(image)
        wanted = set(self.settings.redact_labels)
        return [
            d["box"]
            for d in answer.get("detections", [])
            if d["score"] >= self.settings.redact_min_score and (not wanted or d["label"] in wanted)
        ]

    def _store(self, event: InferenceEvent, image: bytes, blur: list[list[float]]) -> str:
        settings = self.settings
        try:
            jpeg, scale, size = prepare(image, blur, settings.max_image_side, settings.jpeg_quality)
        except (OSError, ValueError) as exc:
            log.warning("a captured %s frame does not decode again: %s", event.model, exc)
            return UNREADABLE
        sample_id = new_sample_id(event.at)
        record = sample_record(event, self.device_id, sample_id, scale, size, len(blur))
        try:
            written = self.spool.write(sample_id, record, jpeg)
        except SpoolFull as exc:
            log.debug("%s", exc)
            return DISK_FULL
        self._metrics.spool_bytes.set(self.spool.used_bytes())
        self.audit.record(
            "captured",
            id=sample_id,
            model=event.model,
            version=event.version,
            bytes=written,
            redacted=len(blur),
            captured_at=round(event.at, 3),  # when the rules kept it (the caps' clock)
        )
        return CAPTURED

    def _sweep(self) -> None:
        """Delete samples past retention (audited)."""
        for sample_id in self.spool.expired(self.settings.retention_days * 86400):
            if self.spool.delete(sample_id):
                self.audit.record("deleted", id=sample_id, reason="retention")
        self._metrics.spool_bytes.set(self.spool.used_bytes())

    def status(self) -> dict[str, Any]:
        """What /v1/status shows under "capture"."""
        return {
            "enabled": True,
            "queued": self._queue.qsize(),
            "queue_size": self.settings.queue_size,
            "samples": len(self.spool.ids()),
            "spool_bytes": self.spool.used_bytes(),
            "outcomes": dict(self._counts),
            "dropped": sum(v for k, v in self._counts.items() if k in (QUEUE_FULL, DISK_FULL)),
        }


def sample_record(
    event: InferenceEvent,
    device_id: str,
    sample_id: str,
    scale: float,
    size: tuple[int, int],
    redacted: int,
) -> dict[str, Any]:
    """What is stored (and uploaded) beside the image: who answered what, and when."""
    answer = event.answer
    if event.task == "classification":
        outputs: dict[str, Any] = {
            "labels": list(answer.get("labels", [])),
            "scores": [float(s) for s in answer.get("scores", [])],
        }
    else:
        outputs = {
            "detections": [
                {
                    "label": d["label"],
                    "score": float(d["score"]),
                    "box": [round(float(v) * scale, 2) for v in d["box"]],
                }
                for d in answer.get("detections", [])[:100]
            ]
        }
    return {
        "id": sample_id,
        "device_id": device_id,
        "model": event.model,
        "version": event.version,
        "variant": event.variant,
        "task": event.task,
        "captured_at": round(event.at, 3),
        "width": size[0],
        "height": size[1],
        "redacted_regions": redacted,
        "outputs": outputs,
    }


def purge(spool: Spool, audit: AuditLog) -> int:
    """Delete every sample (``edgeagent capture purge``), each deletion audited."""
    count = 0
    for sample_id in spool.ids():
        if spool.delete(sample_id):
            audit.record("deleted", id=sample_id, reason="purge")
            count += 1
    with contextlib.suppress(OSError):
        spool.directory.rmdir()
    return count
