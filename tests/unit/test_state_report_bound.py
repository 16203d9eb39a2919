"""The retained state report stays within ``[updates] max_state_bytes`` whatever the device
holds (issue 23: it is re-published on a heartbeat by every device), losing the least first."""

from __future__ import annotations

import json

from edgeagent.fleet.messages import Backend, ModelState, Outcome, StateReport, Updates
from edgeagent.updates.report import UpdateReporter, bounded


def _size(document: dict) -> int:
    return len(json.dumps(document).encode())


def _outcome(index: int, message: str = "fine") -> Outcome:
    return Outcome("refused", "no_variant", message, model=f"m{index}", version="1")


def test_a_small_report_is_sent_whole() -> None:
    report = StateReport(device_id="d", updates=Updates(history=[_outcome(1)]))
    assert bounded(report, 4096)["updates"]["history"][0]["model"] == "m1"


def test_the_oldest_history_goes_first() -> None:
    history = [_outcome(i, "x" * 600) for i in range(10)]
    document = bounded(StateReport(device_id="d", updates=Updates(history=history)), 4096)
    kept = [o["model"] for o in document["updates"]["history"]]
    assert 0 < len(kept) < 10 and kept == [f"m{i}" for i in range(10 - len(kept), 10)]
    assert _size(document) <= 4096


def test_many_models_are_left_out_and_named() -> None:
    models = {
        f"model-{i:04d}": ModelState("READY", "1", {"1": Backend("onnxruntime", "CPU", "fp32")})
        for i in range(500)
    }
    last = _outcome(0, "y" * 5000)
    report = StateReport(device_id="d", models=models, updates=Updates(last=last))
    document = bounded(report, 4096)
    assert _size(document) <= 4096
    assert document["models"] == {} and "models left out" in document["errors"]["report"]
    assert len(document["updates"]["last"]["message"]) < 300  # cut, not dropped


def test_the_reporter_applies_its_bound() -> None:
    big = {f"model-{i}": {"state": "READY", "versions": {}} for i in range(2000)}
    reporter = UpdateReporter("d", "g", sources={"models": lambda: big}, max_state_bytes=8192)
    assert _size(reporter.state()) <= 8192
    assert len(reporter.report().models) == 2000  # /v1/status-side picture untouched
