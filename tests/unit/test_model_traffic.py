"""What a device tells the hub about each model's traffic: counters since the version loaded and
the latency clients saw, in its state report, parsed back by the one contract."""

from __future__ import annotations

import pytest

from edgeagent.engine.stats import ModelStats
from edgeagent.fleet.messages import MessageError, Traffic, decode_state, encode
from edgeagent.updates.report import UpdateReporter

MS = 1_000_000  # ns


def test_traffic_counts_answers_failures_and_cache_hits_and_takes_client_latency() -> None:
    stats = ModelStats(latency_samples=100)
    assert stats.traffic() == {"requests": 0, "errors": 0, "p50_ms": None, "p95_ms": None}
    for ms in range(1, 100):  # 1..99 ms seen by the client, 1 ms of it on the device
        stats.record_request(True, ms * MS, 0, service_ns=MS)
    stats.record_request(False, 500 * MS, server_fault=True)  # a failure has no latency figure
    stats.record_cache(True, 100 * MS)  # a hit is an answer, with its own latency
    stats.record_cache(False, 1 * MS)  # a miss goes on to the batcher, counted there
    traffic = stats.traffic()
    assert (traffic["requests"], traffic["errors"]) == (101, 1)
    assert traffic["p50_ms"] == pytest.approx(50.5) and traffic["p95_ms"] == pytest.approx(95.05)
    # the canary's ring still holds service times, not what the client saw
    assert set(stats.latencies_since(0).tolist()) == {MS}


def test_latency_covers_only_the_newest_answers() -> None:
    stats = ModelStats(latency_samples=10)
    for ms in [1000] * 10 + [2] * 10:  # slow long ago, fast now
        stats.record_request(True, ms * MS)
    assert stats.traffic()["p95_ms"] == pytest.approx(2.0)
    assert stats.traffic()["requests"] == 20


def registry_status(traffic: dict | None) -> dict:
    version = {"runtime": "onnxruntime", "device": "CPU", "precision": "fp32"}
    if traffic is not None:
        version["traffic"] = traffic
    return {"m": {"state": "READY", "active_version": "2", "versions": {"1": {}, "2": version}}}


def test_the_report_carries_the_active_versions_traffic_and_the_hub_reads_it() -> None:
    figures = {"requests": 40, "errors": 3, "p50_ms": 1.25, "p95_ms": 7.5}
    reporter = UpdateReporter("d", "lab", sources={"models": lambda: registry_status(figures)})
    document = reporter.state()
    assert document["models"]["m"]["traffic"] == figures
    assert decode_state(document).models["m"].traffic == Traffic(40, 3, 1.25, 7.5)


def test_a_status_without_traffic_reports_none_and_old_reports_still_parse() -> None:
    reporter = UpdateReporter("d", "lab", sources={"models": lambda: registry_status(None)})
    assert reporter.report().models["m"].traffic is None
    sent = encode(reporter.report())
    assert "traffic" not in sent["models"]["m"]  # as an agent from before the field sent it
    assert decode_state(sent).models["m"].traffic is None


@pytest.mark.parametrize(
    ("traffic", "field"),
    [
        ({"requests": "many"}, "models.m.traffic.requests"),
        ({"errors": 1.5}, "models.m.traffic.errors"),
        ({"p95_ms": "slow"}, "models.m.traffic.p95_ms"),
    ],
)
def test_wrong_traffic_types_are_refused_naming_the_field(traffic: dict, field: str) -> None:
    with pytest.raises(MessageError, match=field.replace(".", r"\.")):
        decode_state({"models": {"m": {"active_version": "1", "traffic": traffic}}})
