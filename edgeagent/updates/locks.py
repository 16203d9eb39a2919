"""Update locks and the gate a release waits at: a local app's lock, the release's window.

A local app doing critical work (a weighing, a print job, a surgery video) holds a lock over
the agent's socket (``POST /v1/update-lock``), and the agent defers a model swap or a
self-update until every lock is released or has expired — balena's update locks. A lock is
named by its holder (one per holder; taking it again renews it) and never lasts longer than
``[updates] max_lock_hold_s`` from when it was first taken: an app that died or forgot its
lock cannot hold the fleet back, and a lock past that maximum is broken with a warning line
naming the holder.

``UpdateGate.wait`` is where a release waits: for its maintenance window (``fleet.windows``,
in the device's local time) and then for the locks. It wakes at once on a release or
expiry of a lock, and otherwise re-checks every ``window_check_s`` (at most 60 s), so a
release that arrived in a closed window starts within that long of the window opening. The
clock is injected: tests move time instead of sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone, tzinfo
from typing import Any

from edgeagent.fleet.windows import MaintenanceWindow

log = logging.getLogger(__name__)

Clock = Callable[[], float]  # seconds since the epoch (time.time); tests move it by hand


class LockError(ValueError):
    """A lock request this device refuses (a hold over the maximum)."""


class TooManyLocks(LockError):
    """``[updates] max_locks`` holders hold a lock already."""


@dataclass
class UpdateLock:
    holder: str
    reason: str
    taken_at: float  # epoch seconds of the first take (renewals keep it)
    expires_at: float

    def to_dict(self, now: float) -> dict[str, Any]:
        return {
            "holder": self.holder,
            "reason": self.reason,
            "taken_at": _iso(self.taken_at),
            "expires_at": _iso(self.expires_at),
            "remaining_s": round(max(0.0, self.expires_at - now), 3),
        }


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat(timespec="seconds")


class UpdateLocks:
    """The locks held now, by holder; a change wakes the gate (``changed``)."""

    def __init__(self, max_hold_s: float, max_locks: int, clock: Clock = time.time) -> None:
        self.max_hold_s = max_hold_s
        self.max_locks = max_locks
        self.clock = clock
        self._locks: dict[str, UpdateLock] = {}
        self.changed = asyncio.Event()  # set on every take, release or break

    def hold(self, holder: str, hold_s: float, reason: str = "") -> UpdateLock:
        """Take (or renew) ``holder``'s lock for ``hold_s`` seconds, capped at the maximum
        counted from the first take."""
        if not 0 < hold_s <= self.max_hold_s:
            raise LockError(
                f"hold_s {hold_s:g} must be in (0, {self.max_hold_s:g}] ([updates] max_lock_hold_s)"
            )
        now = self.clock()
        self._expire(now)
        lock = self._locks.get(holder)
        if lock is None:
            if len(self._locks) >= self.max_locks:
                raise TooManyLocks(f"{self.max_locks} locks are held already ([updates] max_locks)")
            lock = UpdateLock(holder, reason, now, now)
            self._locks[holder] = lock
            log.info("update lock taken by %s for %.0f s (%s)", holder, hold_s, reason or "-")
        lock.reason = reason or lock.reason
        lock.expires_at = min(now + hold_s, lock.taken_at + self.max_hold_s)
        self.changed.set()
        return lock

    def release(self, holder: str) -> bool:
        """Release ``holder``'s lock; False when it held none (or it had expired)."""
        self._expire(self.clock())
        lock = self._locks.pop(holder, None)
        if lock is not None:
            log.info("update lock of %s released", holder)
            self.changed.set()
        return lock is not None

    def holders(self) -> list[dict[str, Any]]:
        now = self.clock()
        self._expire(now)
        return [lock.to_dict(now) for lock in self._locks.values()]

    def held(self) -> list[UpdateLock]:
        """The locks in force now (expired ones are broken first)."""
        self._expire(self.clock())
        return list(self._locks.values())

    def next_expiry(self) -> float | None:
        return min((lock.expires_at for lock in self._locks.values()), default=None)

    def _expire(self, now: float) -> None:
        for holder, lock in list(self._locks.items()):
            if lock.expires_at <= now:
                del self._locks[holder]
                held = now - lock.taken_at
                if lock.expires_at >= lock.taken_at + self.max_hold_s:
                    log.warning(
                        "update lock of %s broken: held %.0f s, past the maximum hold of "
                        "%.0f s ([updates] max_lock_hold_s)",
                        holder,
                        held,
                        self.max_hold_s,
                    )
                else:
                    log.info("update lock of %s expired after %.0f s", holder, held)
                self.changed.set()


class UpdateGate:
    """Where a release waits for its maintenance window, then for the update locks."""

    def __init__(self, locks: UpdateLocks, zone: tzinfo, check_s: float) -> None:
        self.locks = locks
        self.zone = zone  # the device's ([updates] timezone, or the system's)
        self.check_s = check_s

    def blocked(self, window: MaintenanceWindow | None) -> str | None:
        """Why an update may not proceed now, or None."""
        now = self.locks.clock()
        if window is not None:
            moment = datetime.fromtimestamp(now, timezone.utc)
            if not window.is_open(moment, self.zone):
                opens = window.next_open(moment, self.zone).astimezone(window.zone(self.zone))
                return f"maintenance window {window.describe()} is closed; opens {opens:%a %H:%M}"
        held = self.locks.held()
        if held:
            return "update lock(s) held by " + ", ".join(lock.holder for lock in held)
        return None

    async def wait(
        self, window: MaintenanceWindow | None, on_wait: Callable[[str], None] | None = None
    ) -> None:
        """Return once ``window`` is open and no lock is held; ``on_wait(reason)`` is called
        when the reason to wait changes (the caller reports it)."""
        said = None
        while True:
            self.locks.changed.clear()  # before the check: a change after it wakes the wait
            reason = self.blocked(window)
            if reason is None:
                return
            if reason != said and on_wait is not None:
                on_wait(reason)
            said = reason
            timeout = self.check_s
            expiry = self.locks.next_expiry()
            if expiry is not None:
                timeout = max(0.0, min(timeout, expiry - self.locks.clock()))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.locks.changed.wait(), timeout)

    def poke(self) -> None:
        """Re-check now (the clock moved: tests, or the system time was set)."""
        self.locks.changed.set()
