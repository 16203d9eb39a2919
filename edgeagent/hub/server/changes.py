"""A change counter that long-polling clients wait on (``?wait=S&after=N``).

The controller bumps it whenever a deployment changed, the ingest loop after every batch of
device reports it stored — both after their transaction committed. A request that saw version
N waits until the version differs from N.

Two rules keep a client from missing a change:

- **A restart is a change.** The counter does not start at 0: it starts at the process's start
  time in microseconds (``epoch``), so a version a client kept from before a restart is never
  the new process's (it is below it, unless the old process averaged more than one change per
  microsecond of its life). With a counter from 0, a page that had seen version 3 waited, after
  the restart, for the new process to pass 3 — changes in between went unseen.
- **Read the version before the state it describes** (``snapshot``). A version read after the
  state may already count a change the state does not show; the client then waits past it and
  misses it until the next, unrelated change (or its wait's end).

Replicas (several hub servers on one PostgreSQL database) share one counter, the database's
sequence ``changes_counter`` (``SharedChanges``): a change takes its next number, and each
replica reads the sequence every ``FOLLOW_S`` and wakes its waiters when it moved, so the
dashboard's long poll, sent to any replica, sees a stage the leader entered on another one or a
report another replica stored. The sequence never goes back, so a restart needs no epoch there.
The same reading wakes the rollout controller (``on_moved``): a deployment created or paused
through another replica's API is acted on by the leader within ``FOLLOW_S``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from edgeagent.hub.server.schema import changes_counter

T = TypeVar("T")
log = logging.getLogger(__name__)
FOLLOW_S = 0.5  # how often a replica reads the shared counter: its long polls' extra latency


def epoch_version() -> int:
    """Where a new process's counter starts: now, in microseconds (fits the API's 2**62)."""
    return time.time_ns() // 1000


class Changes:
    def __init__(self, start: int | None = None) -> None:
        self.epoch = epoch_version() if start is None else start
        self.version = self.epoch
        self._condition = asyncio.Condition()

    async def bump(self) -> None:
        async with self._condition:
            self.version += 1
            self._condition.notify_all()

    async def wait_past(self, seen: int, timeout_s: float) -> int:
        """Return as soon as the version is not ``seen`` (or after ``timeout_s``)."""
        async with self._condition:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(
                    self._condition.wait_for(lambda: self.version != seen), timeout_s
                )
            return self.version

    async def snapshot(self, read: Callable[[], Awaitable[T]]) -> tuple[int, T]:
        """``read()`` and a version no newer than what it read (see the module docstring)."""
        version = self.version
        return version, await read()


class SharedChanges(Changes):
    """The change counter of replicas on one PostgreSQL database (module docstring)."""

    def __init__(self, engine: AsyncEngine) -> None:
        super().__init__(start=0)
        self.engine = engine
        self.on_moved: Callable[[], None] = lambda: None  # the counter moved (any replica)

    async def bump(self) -> None:
        """Count a change of ours; a number past the next one means other replicas changed
        something since we last looked, which ``on_moved`` hears of as ``follow`` would."""
        seen = self.version
        async with self.engine.begin() as connection:
            value = await connection.scalar(sa.select(changes_counter.next_value()))
        if await self._advance(int(value or 0)) and int(value or 0) > seen + 1:
            self.on_moved()

    async def read(self) -> None:
        """Catch up with the changes every replica counted so far."""
        async with self.engine.connect() as connection:
            value = await connection.scalar(sa.text("SELECT last_value FROM changes_counter"))
        if await self._advance(int(value or 0)):
            self.on_moved()

    async def follow(self) -> None:
        """Read the counter every ``FOLLOW_S`` until cancelled (the database away: logged,
        tried again; a stale counter only delays a long poll)."""
        while True:
            try:
                await self.read()
            except Exception as exc:  # SQLAlchemy wraps every driver's errors differently
                log.warning("reading the shared change counter failed: %s", exc)
            await asyncio.sleep(FOLLOW_S)

    async def _advance(self, value: int) -> bool:
        async with self._condition:
            if value <= self.version:
                return False
            self.version = value
            self._condition.notify_all()
            return True
