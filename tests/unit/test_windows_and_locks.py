"""Maintenance windows in the device's local time, and update locks with a maximum hold."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timezone
from zoneinfo import ZoneInfo

import pytest

from edgeagent.fleet.windows import MaintenanceWindow, WindowError
from edgeagent.updates.locks import LockError, TooManyLocks, UpdateGate, UpdateLocks

BERLIN = ZoneInfo("Europe/Berlin")
UTC = timezone.utc


def at(text: str, zone=UTC) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=zone)


def test_a_weekday_window_in_the_devices_zone() -> None:
    window = MaintenanceWindow("Mon-Fri 02:00-04:00")
    # Monday 2026-12-07, 01:30 UTC = 02:30 in Berlin: open there, closed for a UTC device
    moment = at("2026-12-07 01:30")
    assert window.is_open(moment, BERLIN) and not window.is_open(moment, UTC)
    assert window.next_open(moment, UTC) == at("2026-12-07 02:00")
    assert not window.is_open(at("2026-12-05 02:30"), UTC)  # Saturday
    assert not window.is_open(at("2026-12-07 04:00"), UTC)  # the end is exclusive


def test_the_windows_own_zone_wins_over_the_devices() -> None:
    window = MaintenanceWindow("* 02:00-03:00", "America/New_York")
    assert window.is_open(at("2026-12-07 07:30"), BERLIN)  # 02:30 in New York
    assert not window.is_open(at("2026-12-07 01:30"), BERLIN)


def test_a_span_past_midnight_belongs_to_the_day_it_starts() -> None:
    window = MaintenanceWindow("Fri 22:00-02:00; Sat,Sun 10:00-11:00")
    assert window.is_open(at("2026-12-05 01:00"), UTC)  # Saturday 01:00: Friday's span
    assert not window.is_open(at("2026-12-04 01:00"), UTC)  # Friday 01:00: Thursday has none
    assert window.is_open(at("2026-12-06 10:15"), UTC)


def test_daylight_saving_is_honoured() -> None:
    """02:00-04:00 local on the night Berlin's clocks go forward (29 March 2026) is 01:00-02:00
    UTC; the week before it is 01:00-03:00 UTC."""
    window = MaintenanceWindow("Sun 02:00-04:00", "Europe/Berlin")
    assert window.is_open(at("2026-03-22 02:30"), UTC)  # CET: 03:30 local
    assert not window.is_open(at("2026-03-29 02:30"), UTC)  # CEST: 04:30 local
    assert window.is_open(at("2026-03-29 01:30"), UTC)  # 03:30 local


@pytest.mark.parametrize(
    "schedule",
    ["", "Mon", "Mon 2:00-4:00", "Funday 02:00-04:00", "Mon 25:00-26:00", "Mon 02:00", "x" * 300],
)
def test_a_bad_schedule_is_refused_naming_the_part(schedule: str) -> None:
    with pytest.raises(WindowError):
        MaintenanceWindow(schedule)


def test_a_bad_zone_is_refused() -> None:
    with pytest.raises(WindowError, match="IANA"):
        MaintenanceWindow("* 02:00-03:00", "../etc/passwd")
    with pytest.raises(WindowError, match="unknown"):
        MaintenanceWindow("* 02:00-03:00", "Mars/Olympus")
    assert MaintenanceWindow.parse({"schedule": "* 02:00-03:00"}).timezone is None
    with pytest.raises(WindowError):
        MaintenanceWindow.parse({"schedule": "* 02:00-03:00", "cron": "x"})


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_a_hold_is_capped_by_the_maximum_from_the_first_take() -> None:
    clock = Clock()
    locks = UpdateLocks(max_hold_s=100, max_locks=2, clock=clock)
    with pytest.raises(LockError, match="max_lock_hold_s"):
        locks.hold("app", 101)
    first = locks.hold("app", 60, "weighing")
    assert first.expires_at == clock.now + 60
    clock.now += 50
    renewed = locks.hold("app", 100)  # renewing never reaches past taken_at + 100
    assert renewed.expires_at == first.taken_at + 100 and renewed.reason == "weighing"
    locks.hold("other", 10)
    with pytest.raises(TooManyLocks):
        locks.hold("third", 10)
    assert locks.release("other") and not locks.release("other")


def test_a_lock_past_its_maximum_hold_is_broken_with_a_log_line(caplog) -> None:
    clock = Clock()
    locks = UpdateLocks(max_hold_s=30, max_locks=4, clock=clock)
    locks.hold("app", 30)
    clock.now += 29
    assert [lock.holder for lock in locks.held()] == ["app"]
    clock.now += 1
    with caplog.at_level(logging.WARNING, logger="edgeagent.updates.locks"):
        assert locks.held() == []
    assert any("update lock of app broken" in r.getMessage() for r in caplog.records)


async def test_the_gate_waits_for_the_window_then_the_lock() -> None:
    clock = Clock(at("2026-12-07 01:00").timestamp())  # Monday, an hour before the window
    locks = UpdateLocks(max_hold_s=7200, max_locks=4, clock=clock)
    gate = UpdateGate(locks, UTC, check_s=60)  # wakes on pokes and lock changes, not the timer
    window = MaintenanceWindow("Mon 02:00-04:00")
    reasons: list[str] = []
    said = asyncio.Event()
    waiting = asyncio.create_task(gate.wait(window, lambda r: (reasons.append(r), said.set())))
    await asyncio.wait_for(said.wait(), 5)
    assert "window" in reasons[0] and "opens Mon 02:00" in reasons[0]
    said.clear()
    locks.hold("app", 7200)  # until 03:00
    clock.now = at("2026-12-07 02:00").timestamp()  # the window opens; the lock still holds
    gate.poke()
    await asyncio.wait_for(said.wait(), 5)
    assert "held by app" in reasons[1] and not waiting.done()
    locks.release("app")
    await asyncio.wait_for(waiting, 5)


def test_a_window_travels_in_the_signed_manifest_and_a_stage_may_have_its_own() -> None:
    from datetime import timedelta

    from edgeagent.fleet.manifest import (
        Artifact,
        ManifestError,
        ReleaseManifest,
        VariantArtifact,
        parse_manifest,
    )
    from edgeagent.hub.rollout import stage_manifest

    now = at("2026-12-07 00:00")
    pinned = Artifact("http://hub/a.tar.gz", 10, "a" * 64)
    manifest = ReleaseManifest(
        model="m",
        version="2",
        serial=3,
        artifact=pinned,
        variants=(VariantArtifact("onnxruntime", "fp32", pinned),),
        issued_at=now,
        expires=now + timedelta(days=1),
        deployment_id="d",
        window=MaintenanceWindow("Mon-Fri 02:00-04:00", "Europe/Berlin"),
    )
    assert parse_manifest(manifest.to_payload()) == manifest
    weekend = MaintenanceWindow("Sat,Sun 01:00-05:00")
    staged = stage_manifest(manifest, ["dev-1"], weekend)
    assert staged.window == weekend and staged.targets.device_ids == ("dev-1",)
    assert stage_manifest(manifest, ["dev-1"]).window == manifest.window
    broken = manifest.to_payload().replace(b"Mon-Fri", b"Mon-Funday")
    with pytest.raises(ManifestError, match="manifest window"):
        parse_manifest(broken)
