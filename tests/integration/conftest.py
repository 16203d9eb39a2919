"""Fixtures for the integration tests that need a real Mosquitto."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.broker import Broker


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    """A started broker; pytest runs the stop after the yield even when the test fails."""
    instance = Broker(tmp_path / "broker")
    instance.start()
    yield instance
    instance.stop()
