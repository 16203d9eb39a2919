"""Maintenance windows: when a device may take a release, in the device's own local time.

A window is carried in the signed release (``window`` in the manifest), set per deployment or
per rollout stage by the hub, and evaluated on the device, so a fleet spread over time zones
each updates in its own night. The schedule is cron-like but readable::

    Mon-Fri 02:00-04:00
    Sat,Sun 00:00-06:00; Mon-Fri 22:30-01:00
    * 03:00-03:30

Entries are separated by ``;``; each names days (``Mon``…``Sun``, ranges ``Mon-Fri``, lists
``Sat,Sun``, ``*`` for every day) and a span ``HH:MM-HH:MM``. A span that ends at or before it
starts runs past midnight and belongs to the day it starts on (``Fri 22:00-02:00`` is open
early on Saturday). ``timezone`` is an IANA name (``Europe/Berlin``); without one the device's
local zone applies (``[updates] timezone``, else the system's). Evaluated with ``zoneinfo``, so
daylight-saving changes are honoured: ``02:00-04:00`` is two hours of wall-clock time, one on
the night the clocks go forward.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, tzinfo
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

__all__ = ["MaintenanceWindow", "WindowError", "device_zone"]

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
MAX_SCHEDULE_CHARS = 256
MAX_ENTRIES = 14
_SPAN_RE = re.compile(r"\A([01][0-9]|2[0-3]):([0-5][0-9])-([01][0-9]|2[0-3]|24):([0-5][0-9])\Z")
_ZONE_RE = re.compile(r"\A[A-Za-z][A-Za-z0-9_+\-/]{0,63}\Z")


class WindowError(ValueError):
    """A schedule or time zone that cannot be evaluated; the message names the part."""


def zone(name: str) -> ZoneInfo:
    """An IANA time zone by name, or ``WindowError``."""
    if not _ZONE_RE.match(name) or ".." in name:
        raise WindowError(f"time zone {name[:64]!r} is not an IANA name such as Europe/Berlin")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise WindowError(f"time zone {name!r} is unknown here (tzdata)") from exc


def device_zone(name: str = "") -> tzinfo:
    """The device's zone: ``name`` (``[updates] timezone``) or the system's local zone."""
    if name:
        return zone(name)
    local = datetime.now().astimezone().tzinfo
    assert local is not None  # astimezone() always gives an aware time
    return local


def _days(text: str) -> frozenset[int]:
    if text == "*":
        return frozenset(range(7))
    found: set[int] = set()
    for part in text.lower().split(","):
        first, _, last = part.partition("-")
        if first not in DAYS or (last and last not in DAYS):
            raise WindowError(f"days {text!r}: use Mon..Sun, ranges Mon-Fri, lists Sat,Sun or *")
        start, end = DAYS.index(first), DAYS.index(last or first)
        found.update((start + step) % 7 for step in range((end - start) % 7 + 1))
    return frozenset(found)


@dataclass(frozen=True)
class _Entry:
    days: frozenset[int]  # weekday numbers, Monday = 0
    start: int  # minutes after midnight
    minutes: int  # length, 1..1440

    def open_at(self, local: datetime) -> bool:
        minute = local.hour * 60 + local.minute
        for back in (0, 1):  # the span may have started the day before (past midnight)
            if (local.weekday() - back) % 7 in self.days:
                offset = minute + back * 1440 - self.start
                if 0 <= offset < self.minutes:
                    return True
        return False


def _entry(text: str) -> _Entry:
    parts = text.split()
    if len(parts) != 2:
        raise WindowError(f"{text!r}: each entry is DAYS HH:MM-HH:MM, e.g. 'Mon-Fri 02:00-04:00'")
    match = _SPAN_RE.match(parts[1])
    if not match:
        raise WindowError(f"{parts[1]!r}: the span is HH:MM-HH:MM (24-hour clock)")
    h1, m1, h2, m2 = (int(group) for group in match.groups())
    start, end = h1 * 60 + m1, min(1440, h2 * 60 + m2)
    return _Entry(_days(parts[0]), start, (end - start) % 1440 or 1440)


@dataclass(frozen=True)
class MaintenanceWindow:
    """A parsed schedule and its zone (None: the device's); see the module docstring."""

    schedule: str
    timezone: str | None = None
    entries: tuple[_Entry, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        """Parsed now, so a window that exists can always be evaluated."""
        text = self.schedule
        if not text.strip() or len(text) > MAX_SCHEDULE_CHARS:
            raise WindowError(f"schedule must be 1-{MAX_SCHEDULE_CHARS} characters")
        items = [item.strip() for item in text.split(";") if item.strip()]
        if not items or len(items) > MAX_ENTRIES:
            raise WindowError(f"schedule must have 1-{MAX_ENTRIES} entries separated by ';'")
        object.__setattr__(self, "entries", tuple(_entry(item) for item in items))
        if self.timezone is not None:
            zone(self.timezone)

    def zone(self, device: tzinfo) -> tzinfo:
        return zone(self.timezone) if self.timezone else device

    def is_open(self, now: datetime, device: tzinfo) -> bool:
        """Whether the window is open at ``now`` (aware) in its zone (or ``device``'s)."""
        local = now.astimezone(self.zone(device))
        return any(entry.open_at(local) for entry in self.entries)

    def next_open(self, now: datetime, device: tzinfo) -> datetime:
        """The first minute at or after ``now`` when the window is open (within 8 days)."""
        moment = now.replace(second=0, microsecond=0)
        if moment < now:
            moment += timedelta(minutes=1)
        for _ in range(8 * 1440):
            if self.is_open(moment, device):
                return moment
            moment += timedelta(minutes=1)
        raise WindowError(f"{self.schedule!r} never opens")  # unreachable for a valid schedule

    def to_dict(self) -> dict[str, Any]:
        zone_field = {} if self.timezone is None else {"timezone": self.timezone}
        return {"schedule": self.schedule, **zone_field}

    @classmethod
    def parse(cls, value: Any) -> MaintenanceWindow:
        """A manifest's ``window`` object: ``schedule`` and optional ``timezone``."""
        if not isinstance(value, dict) or not {"schedule"} <= set(value) <= {
            "schedule",
            "timezone",
        }:
            raise WindowError("must be an object with schedule and optional timezone")
        schedule, timezone = value["schedule"], value.get("timezone")
        if not isinstance(schedule, str) or not (timezone is None or isinstance(timezone, str)):
            raise WindowError("schedule and timezone must be strings")
        return cls(schedule, timezone)

    def describe(self) -> str:
        return f"{self.schedule} ({self.timezone or 'device-local time'})"
