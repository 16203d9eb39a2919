"""asyncio helpers: shutdowns never hang on a stuck task; the loop the daemon runs on."""

from __future__ import annotations

import asyncio
import logging

import pytest

from edgeagent import aio
from edgeagent.aio import cancel_and_wait


async def test_cooperative_tasks_are_cancelled_and_awaited() -> None:
    task = asyncio.create_task(asyncio.sleep(60), name="sleeper")
    await cancel_and_wait([task], timeout_s=5)
    assert task.cancelled()


async def test_a_task_that_swallows_cancellation_is_abandoned_in_time(
    caplog: pytest.LogCaptureFixture,
) -> None:
    never = asyncio.Event()

    async def stubborn() -> None:  # like a library awaiting a peer's acknowledgement forever
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            await never.wait()

    task = asyncio.create_task(stubborn(), name="stubborn")
    await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    started = loop.time()
    with caplog.at_level(logging.ERROR):
        await cancel_and_wait([task], timeout_s=0.2)
    assert loop.time() - started < 2
    assert "task stubborn did not stop within 0.2 s; abandoned" in caplog.text
    await asyncio.sleep(0)
    assert task.done()  # the second cancel reached it


async def test_a_cancellation_swallowed_once_is_repeated_until_the_task_stops(
    caplog: pytest.LogCaptureFixture,
) -> None:
    swallowed = asyncio.Event()

    async def serving() -> None:  # Python 3.11's wait_for losing a cancel as a SUBACK lands
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            swallowed.set()  # ...and the client goes on serving until cancelled again
        await asyncio.sleep(60)

    task = asyncio.create_task(serving(), name="serving")
    await asyncio.sleep(0)
    with caplog.at_level(logging.ERROR):
        await cancel_and_wait([task], timeout_s=30, recancel_s=0.05)
    assert swallowed.is_set() and task.cancelled()
    assert "abandoned" not in caplog.text


async def _loop_module() -> str:
    return type(asyncio.get_running_loop()).__module__.split(".")[0]


def test_run_on_the_asyncio_loop_when_asked() -> None:
    assert aio.run(_loop_module(), "asyncio") == "asyncio"


def test_run_on_uvloop_when_asked_or_installed() -> None:
    pytest.importorskip("uvloop")
    assert aio.run(_loop_module(), "uvloop") == "uvloop"
    assert aio.run(_loop_module(), "auto") == "uvloop"


def test_auto_falls_back_to_asyncio_without_uvloop(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aio, "uvloop_installed", lambda: False)
    assert aio.run(_loop_module(), "auto") == "asyncio"


def test_asking_for_uvloop_without_it_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from edgeagent.api import settings
    from edgeagent.sections import ConfigError

    monkeypatch.setattr(settings, "uvloop_installed", lambda: False)
    with pytest.raises(ConfigError, match="event_loop"):
        settings.ServerSettings(event_loop="uvloop").validate()
    settings.ServerSettings(event_loop="auto").validate()
