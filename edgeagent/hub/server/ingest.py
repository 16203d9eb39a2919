"""Device messages → database, in batches, skipping (and counting) whatever is malformed.

The MQTT link hands every message to ``submit``; one writer task takes them off a bounded
queue and applies as many as are waiting in one transaction (the retained reports of a whole
fleet arrive at once on start). A message the parser refuses is logged and counted in
``stats["skipped"]``; a batch the database refuses is retried one message at a time, so one
bad row never loses its neighbours. Answers to deployments are written in device-id order,
the one order every writer of those rows takes (``deploydb.lock_devices``). A *sync marker*
put on the queue by the link after its subscriptions tells when everything the broker had
retained has been stored: ``synced`` is set then, and ``retained_devices`` says how many
devices that was.

Every replica of the hub (several servers on one database) receives every report, each in its
own persistent session, so none is lost when a replica dies; the database keeps each once.
A history row carries its report's identity (topic and bytes hashed: events and state
reports carry the device's own time, so two reports never share one) and is inserted only if
no replica stored it yet; an availability row (its bytes are only "online"/"offline") only when
the device's availability changes; and a device's row takes a state report no older than the
one it holds, so a replica that lags behind writes no stale picture over a fresh one.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from edgeagent.hub.server import fleetdb
from edgeagent.hub.server.deploydb import record_outcome
from edgeagent.hub.server.reports import (
    DeviceEvent,
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
        parsed = [p for m in batch if isinstance(m, Incoming) and (p := self._parse(m))]
        try:
            async with self.engine.begin() as connection:
                answered = await self._write(connection, parsed)
        except Exception as exc:
            log.warning(
                "storing %d reports failed (%s: %s); retrying one by one",
                len(parsed),
                exc.__class__.__name__,
                exc,
            )
            answered = False
            for report in parsed:
                answered |= await self._write_alone(report)
        else:
            self._count(parsed)
        if self.on_batch is not None:
            await self.on_batch(answered)
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

    def _count(self, stored: list[Parsed]) -> None:
        self.stats["stored"] += len(stored)
        for report in stored:
            if report.retained:
                self.stats["retained"] += 1
                self._retained_seen.add(report.device_id)

    async def _write_alone(self, report: Parsed) -> bool:
        try:
            async with self.engine.begin() as connection:
                answered = await self._write(connection, [report])
        except Exception as exc:
            self._skip(report.topic, f"database refused it ({exc.__class__.__name__}: {exc})")
            return False
        self._count([report])
        return answered

    def _skip(self, topic: str, reason: str) -> None:
        self.stats["skipped"] += 1
        log.warning("skipped the report on %.200s: %s", topic, reason)

    def _parse(self, message: Incoming) -> Parsed | None:
        """What one message will write, or None (skipped, with the reason logged)."""
        self.stats["received"] += 1
        if not message.payload:
            return None  # a cleared retained message
        try:
            where = parse_topic(message.topic, self.prefix)
            if len(message.payload) > self.max_report_bytes:
                raise ReportError(
                    f"{len(message.payload)} bytes is over --max-report-bytes "
                    f"{self.max_report_bytes}"
                )
            return _parse_kind(where.device_id, where.kind, message)
        except ReportError as exc:
            self._skip(message.topic, str(exc))
            return None

    async def _write(self, connection: AsyncConnection, reports: list[Parsed]) -> bool:
        """Store the batch: one upsert per column set, one insert of history rows, then the
        deployment answers. True when a device answered a deployment."""
        now = time.time()
        states = {r.device_id for r in reports if r.kind == "state"}
        flips = {r.device_id for r in reports if r.kind == "availability"}
        known: dict[str, float | None] = {}
        availability: dict[str, str] = {}
        if states or flips:  # a report the hub already has (a replay on resubscribe) adds no row
            rows = await connection.execute(
                sa.select(devices.c.device_id, devices.c.reported_at, devices.c.availability).where(
                    devices.c.device_id.in_(states | flips)
                )
            )
            for device, reported, available in rows.all():
                known[device], availability[device] = reported, available
        groups: dict[tuple[str, ...], dict[str, dict[str, Any]]] = {}
        history = []
        for report in reports:
            row = {"device_id": report.device_id, **report.values, "last_seen": now}
            groups.setdefault(tuple(row), {})[report.device_id] = row  # the last one wins
            replay = (
                report.kind == "state"
                and known.get(report.device_id, -1.0) == (report.values["reported_at"])
            )
            if report.kind == "availability":
                value = report.values["availability"]
                replay = availability.get(report.device_id) == value
                availability[report.device_id] = value
            if report.history is not None and not replay:
                history.append(
                    {
                        "device_id": report.device_id,
                        "at": now,
                        "report_id": report.report_id,
                        **report.history,
                    }
                )
        for rows_of_a_kind in groups.values():
            await fleetdb.upsert_devices(connection, list(rows_of_a_kind.values()))
        await fleetdb.append_events(connection, history)
        answered = False
        # in device-id order, the order the controller locks the same rows in (deploydb.
        # lock_devices): in arrival order the two can deadlock on PostgreSQL
        for report in sorted(reports, key=lambda r: r.device_id):
            event = report.event
            if event is not None and event.outcome and event.deployment_id:
                answered |= await record_outcome(
                    connection,
                    report.device_id,
                    event.deployment_id,
                    outcome=event.outcome,
                    result=event.result,
                    code=event.code,
                    message=event.message,
                    now=now,
                    ended_at=report.ended_at,
                )
        return answered


@dataclass(frozen=True)
class Parsed:
    """One checked message: the device columns it sets and the history row it adds."""

    topic: str
    device_id: str
    kind: str
    retained: bool
    values: dict[str, Any]
    history: dict[str, Any] | None
    event: DeviceEvent | None = None
    ended_at: float | None = None  # set when ``event`` is a state report's last outcome
    report_id: str | None = None  # the report's identity (None: availability, see above)


def _report_id(message: Incoming) -> str:
    """A report's identity: the same report received twice (by two replicas, or redelivered
    by the broker) has the same one."""
    digest = hashlib.sha256(message.topic.encode())
    digest.update(b"\0")
    digest.update(message.payload)
    return digest.hexdigest()


def _parse_kind(device_id: str, kind: str, message: Incoming) -> Parsed:
    def parsed(
        values: dict[str, Any],
        history: dict[str, Any],
        event: DeviceEvent | None = None,
        ended_at: float | None = None,
    ) -> Parsed:
        return Parsed(
            message.topic,
            device_id,
            kind,
            message.retained,
            values,
            history,
            event,
            ended_at,
            None if kind == "availability" else _report_id(message),
        )

    if kind == "availability":
        availability = parse_availability(message.payload)
        return parsed({"availability": availability}, {"kind": kind, "step": availability})
    if kind == "state":
        report = parse_state(message.payload)
        history = {"kind": kind, "detail": report.summary}
        if report.last is None or report.last_at is None:
            return parsed(report.values, history)
        return parsed(report.values, history, report.last, report.last_at)
    event = parse_event(message.payload)
    history = {
        "kind": "event",
        "deployment_id": event.deployment_id,
        "step": event.step,
        "result": event.result,
        "code": event.code,
        "detail": event.detail,
    }
    return parsed({}, history, event)
