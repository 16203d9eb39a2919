"""A release signed with a maintenance window waits for it in the device's local time, with an
injected clock (no sleeping through an hour): nothing is downloaded while the window is closed,
and the install starts on the gate's own re-check once it opens."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone

from devtools.waiting import until
from edgeagent.fleet.windows import MaintenanceWindow
from edgeagent.updates.locks import UpdateGate, UpdateLocks
from tests.integration.test_updates_helpers import (
    add_golden,
    device_fixture,  # noqa: F401 - fixture
    hub_fixture,  # noqa: F401 - fixture
)

OPENS = datetime(2026, 12, 7, 2, 0, tzinfo=timezone.utc)  # a Monday, 02:00 UTC


class Clock:
    def __init__(self, now: datetime) -> None:
        self.now = now.timestamp()

    def __call__(self) -> float:
        return self.now


async def test_a_release_in_a_closed_window_waits_then_installs_when_it_opens(hub, device):
    (hub.keys / "serials.json").write_text('{"tiny": 9}')
    assert (await device.apply(hub.release("1")))["result"] == "succeeded"
    clock = Clock(OPENS.replace(hour=1, minute=59))  # a minute before the window
    # the device's zone is UTC here; the window names its own zone to show it is carried
    device.updater.gate = UpdateGate(UpdateLocks(600, 8, clock), timezone.utc, check_s=0.05)
    window = MaintenanceWindow("Mon-Fri 03:00-05:00", "Europe/Berlin")  # 02:00 UTC in winter
    envelope = hub.sign(add_golden(hub.package("2", seed=2)), window=window)

    installing = asyncio.create_task(device.apply(envelope))
    await until(lambda: any(e.get("step") == "deferred" for e in device.events))
    deferred = next(e for e in device.events if e.get("step") == "deferred")
    assert "Mon-Fri 03:00-05:00 (Europe/Berlin) is closed" in deferred["reason"]
    assert not any(e.get("step") == "downloading" and e["version"] == "2" for e in device.events)
    assert device.serving() == "1" and not installing.done()

    clock.now = OPENS.timestamp() + 30  # open for 30 s; no poke: the gate's timer finds it
    outcome = await asyncio.wait_for(installing, 60)
    assert outcome["result"] == "succeeded", outcome
    assert device.serving() == "2"
    started = next(e for e in device.events if e.get("step") == "verified" and e["version"] == "2")
    assert started is not None and clock.now - OPENS.timestamp() <= 60
