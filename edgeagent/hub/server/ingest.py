"""Device messages → database, in batches, skipping (and counting) whatever is malformed.

The MQTT link hands every message to ``submit``; one writer task takes them off a bounded
queue and applies as many as are waiting in one transaction (the retained reports of a whole
fleet arrive at once on start). A message the parser refuses is logged and counted in
``stats["skipped"]``; a batch the database refuses is retried one message at a time, so one
bad row never loses its neighbours. A *sync marker* put on the queue by the link after its
subscriptions tells when everything the broker had retained has been stored: ``synced`` is set
then, and ``retained_devices`` says how many devices that was.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from edgeagent.hub.server import fleetdb
from edgeagent.hub.server.deploydb import record_outcome
from edgeagent.hub.server.reports import (
    ReportError,
    parse_availability,
    parse_event,
    parse_state,
    parse_topic,
)
from edgeagent.hub.server.schema import devices

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Incoming:
    topic: str
    payload: bytes
    retained: bool


@dataclass(frozen=True)
class SyncMarker:
    """Everything queued before this was retained state the broker held when we subscribed."""

    token: str


class Ingest:
    def __init__(
        self,
        engine: AsyncEngine,
        prefix: str,
        *,
        max_report_bytes: int,
        queue_size: int = 10_000,
        batch_size: int = 500,
        on_batch: Callable[[bool], Awaitable[None]] | None = None,
    ) -> None:
        self.engine = engine
        self.prefix = prefix
        self.max_report_bytes = max_report_bytes
        self.on_batch = on_batch  # after each stored batch; True when a device answered
        self.batch_size = batch_size
        self.queue: asyncio.Queue[Incoming | SyncMarker] = asyncio.Queue(queue_size)
        self.synced = asyncio.Event()
        self.sync_token = ""  # the marker the link is waiting for (a new one per connection)
        self.sync_started = 0.0  # monotonic time the link subscribed
        self.sync_seconds: float | None = None  # subscribe → every retained report stored
        self.retained_devices = 0
        self.stats = {"received": 0, "stored": 0, "skipped": 0, "retained": 0}
        self._retained_seen: set[str] = set()

    def expect_sync(self, token: str) -> None:
        """The link subscribed and will send marker ``token`` through the broker."""
        self.sync_token = token
        self.sync_started = time.monotonic()

    async def submit(self, item: Incoming | SyncMarker) -> None:
        """Queue a message (waits when the writer is behind: back-pressure on the broker)."""
        await self.queue.put(item)

    async def run(self) -> None:
        """The writer: batch what is waiting, store it, repeat until cancelled."""
        while True:
            batch = [await self.queue.get()]
            while len(batch) < self.batch_size and not self.queue.empty():
                batch.append(self.queue.get_nowait())
            await self._store(batch)

    async def _store(self, batch: list[Incoming | SyncMarker]) -> None:
        messages = [m for m in batch if isinstance(m, Incoming)]
        try:
            async with self.engine.begin() as connection:
                outcomes = [await self._apply(connection, m) for m in messages]
        except Exception:
            log.warning("storing %d reports failed; retrying one by one", len(messages))
            outcomes = [await self._apply_alone(m) for m in messages]
        if self.on_batch is not None:
            await self.on_batch(any(outcomes))
        for marker in batch:
            if isinstance(marker, SyncMarker) and marker.token == self.sync_token:
                self.retained_devices = len(self._retained_seen)
                self.sync_seconds = time.monotonic() - self.sync_started
                log.info(
                    "read the broker's retained reports in %.2f s: %d device(s), %d message(s), "
                    "%d skipped so far",
                    self.sync_seconds,
                    self.retained_devices,
                    self.stats["retained"],
                    self.stats["skipped"],
                )
                self.synced.set()

    async def _apply_alone(self, message: Incoming) -> bool:
        try:
            async with self.engine.begin() as connection:
                return await self._apply(connection, message)
        except Exception as exc:
            self._skip(message, f"database refused it ({exc.__class__.__name__}: {exc})")
            return False

    def _skip(self, message: Incoming, reason: str) -> None:
        self.stats["skipped"] += 1
        log.warning("skipped the report on %.200s: %s", message.topic, reason)

    async def _apply(self, connection: AsyncConnection, message: Incoming) -> bool:
        """Store one message; True when it answered a deployment."""
        self.stats["received"] += 1
        if not message.payload:
            return False  # a cleared retained message
        try:
            where = parse_topic(message.topic, self.prefix)
            if len(message.payload) > self.max_report_bytes:
                raise ReportError(
                    f"{len(message.payload)} bytes is over --max-report-bytes "
                    f"{self.max_report_bytes}"
                )
            answered = await self._apply_kind(connection, where.device_id, where.kind, message)
        except ReportError as exc:
            self._skip(message, str(exc))
            return False
        self.stats["stored"] += 1
        if message.retained:
            self.stats["retained"] += 1
            self._retained_seen.add(where.device_id)
        return answered

    async def _apply_kind(
        self, connection: AsyncConnection, device_id: str, kind: str, message: Incoming
    ) -> bool:
        now = time.time()
        if kind == "availability":
            availability = parse_availability(message.payload)
            await fleetdb.upsert_device(connection, device_id, {"availability": availability}, now)
            await fleetdb.append_event(
                connection, device_id, "availability", now, step=availability
            )
            return False
        if kind == "state":
            report = parse_state(message.payload)
            known = await connection.scalar(
                sa.select(devices.c.reported_at).where(devices.c.device_id == device_id)
            )
            await fleetdb.upsert_device(connection, device_id, report.values, now)
            if known is None or known != report.values["reported_at"]:  # not a replay
                await fleetdb.append_event(
                    connection, device_id, "state", now, detail=report.summary
                )
            return False
        event = parse_event(message.payload)
        await fleetdb.upsert_device(connection, device_id, {}, now)
        await fleetdb.append_event(
            connection,
            device_id,
            "event",
            now,
            deployment_id=event.deployment_id,
            step=event.step,
            result=event.result,
            code=event.code,
            detail=event.detail,
        )
        if not (event.outcome and event.deployment_id):
            return False
        return await record_outcome(
            connection,
            device_id,
            event.deployment_id,
            outcome=event.outcome,
            result=event.result,
            code=event.code,
            message=event.message,
            now=now,
        )
