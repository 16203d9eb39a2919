"""Capture rules: band, labels, sampling and sliding-window caps; the hook never waits."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgeagent.capture.rules import Rules
from edgeagent.capture.service import Capture
from edgeagent.capture.settings import CaptureSettings
from edgeagent.capture.uploader import in_schedule
from edgeagent.engine.hooks import InferenceEvent
from edgeagent.models.capture_table import CaptureHints, read_capture
from edgeagent.models.toml_fields import PackageError


def event(score: float, label: str = "cat") -> InferenceEvent:
    answer = {"labels": [label], "scores": [score]}
    return InferenceEvent("m", "1", "classification", "onnxruntime/fp32@cpu", b"", answer)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_caps_hold_for_every_window_wherever_it_starts() -> None:
    clock = Clock()
    settings = CaptureSettings(sample_percent=100.0, per_minute=2, per_hour=5, per_day=0)
    rules = Rules(settings, clock=clock)
    kept: list[float] = []
    for step in range(400):  # one request every 7 s for ~47 minutes
        clock.now = step * 7.0
        if rules.decide(event(0.5), CaptureHints()) is None:
            kept.append(clock.now)
    for start in kept:
        assert sum(start <= t < start + 60 for t in kept) <= 2
        assert sum(start <= t < start + 3600 for t in kept) <= 5
    assert len(kept) == 5


def test_band_labels_sampling_and_the_packages_overrides() -> None:
    draws = iter([0.05, 0.5])
    settings = CaptureSettings(min_confidence=0.2, max_confidence=0.7, sample_percent=10.0)
    rules = Rules(settings, draw=lambda: next(draws))
    assert rules.decide(event(0.9), CaptureHints()) == "confidence"
    assert rules.decide(event(0.5), CaptureHints()) is None  # draw 0.05 < 10 %
    assert rules.decide(event(0.5), CaptureHints()) == "sampling"  # draw 0.5
    hints = read_capture(Path("model.toml"), {"labels": ["dog"], "max_confidence": 0.95})
    assert Rules(settings).decide(event(0.9, "cat"), hints) == "label"
    assert read_capture(Path("m"), {"no_capture": True}).no_capture
    with pytest.raises(PackageError, match="capture.sample_percent: must be between 0 and 100"):
        read_capture(Path("m"), {"sample_percent": 150})
    with pytest.raises(PackageError, match="unknown field"):
        read_capture(Path("m"), {"sampel_percent": 5})


async def test_a_full_queue_drops_and_counts_without_waiting(tmp_path: Path) -> None:
    settings = CaptureSettings(enabled=True, sample_percent=100.0, queue_size=1, per_minute=0)
    capture = Capture(settings, tmp_path, lambda: b"k" * 32, device_id="d")  # worker not started
    for _ in range(3):
        capture.hook(event(0.5))
    assert capture.status()["outcomes"] == {"queue_full": 2}
    assert capture.status()["dropped"] == 2 and capture.status()["queued"] == 1


def test_schedule_windows_may_wrap_midnight() -> None:
    from datetime import time

    assert in_schedule([], time(12, 0))
    assert in_schedule(["22:00-04:00"], time(1, 30)) and not in_schedule(["22:00-04:00"], time(5))
    assert in_schedule(["01:00-05:00", "13:00-14:00"], time(13, 59))


async def test_the_pacer_keeps_to_its_rate_with_one_second_of_credit() -> None:
    from edgeagent.capture.uploader import Pacer

    clock = Clock()
    waits: list[float] = []

    async def sleep(seconds: float) -> None:
        waits.append(seconds)
        clock.now += seconds

    pacer = Pacer(1000.0, clock=clock)
    import edgeagent.capture.uploader as uploader

    original = uploader.asyncio.sleep
    uploader.asyncio.sleep = sleep  # type: ignore[assignment]
    try:
        for _ in range(5):
            await pacer.take(500)  # 2500 bytes at 1000 B/s: 2.5 s, the first 0.5 s at once
        assert clock.now == pytest.approx(2.0)
        clock.now += 10.0  # idle: at most one second of credit builds up
        for _ in range(4):
            await pacer.take(500)
        assert clock.now == pytest.approx(12.5)  # 1 s of credit, then the rate again
    finally:
        uploader.asyncio.sleep = original  # type: ignore[assignment]
