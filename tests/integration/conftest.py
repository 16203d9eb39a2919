"""Fixtures for the integration tests that need a real Mosquitto."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from devtools.broker import Broker
from tests.support.mqtt import Device


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    """A started broker; pytest runs the stop after the yield even when the test fails."""
    instance = Broker(tmp_path / "broker")
    instance.start()
    yield instance
    instance.stop()


@pytest.fixture
async def devices() -> AsyncIterator[list[Device]]:
    """Devices a test starts; each is stopped at teardown, whatever the test did."""
    started: list[Device] = []
    yield started
    for device in started:
        await device.stop()
