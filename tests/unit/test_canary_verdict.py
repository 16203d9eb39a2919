"""The canary's judgement on its own: p99 over the canary window, the bounded latency ring,
fail-fast on errors, the max_seconds rule, and the bounds of every threshold."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from edgeagent.engine.canary_judge import PROMOTED, ROLLED_BACK, Canary, CanaryPolicy
from edgeagent.engine.stats import LatencyRing, ModelStats

MS = 1_000_000


def version(name: str) -> SimpleNamespace:
    """What the judgement reads of a loaded version: its stats and its version string."""
    return SimpleNamespace(version=name, stats=ModelStats(latency_samples=256))


def answer(model: SimpleNamespace, *latencies_ms: float, failed: int = 0) -> None:
    for ms in latencies_ms:
        model.stats.record_request(True, int(ms * MS))
    for _ in range(failed):
        model.stats.record_request(False, MS, server_fault=True)


def test_the_ring_returns_only_samples_after_the_mark_and_at_most_its_size() -> None:
    ring = LatencyRing(4)
    for ns in (1, 2, 3):
        ring.add(ns)
    mark = ring.count
    assert ring.since(mark).tolist() == []
    for ns in (4, 5, 6):
        ring.add(ns)
    assert ring.since(mark).tolist() == [4, 5, 6]
    assert ring.since(0).tolist() == [3, 4, 5, 6]  # wrapped: the newest four, oldest first
    with pytest.raises(ValueError, match="at least one slot"):
        LatencyRing(0)


async def test_a_slow_tail_the_mean_hides_is_rolled_back_on_p99() -> None:
    stable, new = version("1"), version("2")
    canary = Canary(new, stable, CanaryPolicy(min_requests=100, max_p99_ratio=1.5))
    answer(stable, *[1.0] * 300)
    answer(new, *[1.0] * 97, 10.0, 10.0, 10.0)  # mean 1.27 ms: a mean ratio would pass
    verdict = canary.judge(stable)
    assert verdict is not None and verdict.outcome == ROLLED_BACK
    assert verdict.canary_p99_ms == pytest.approx(10.0)
    assert verdict.stable_p99_ms == pytest.approx(1.0)
    assert verdict.p99_ratio == pytest.approx(10.0)
    assert (verdict.canary_requests, verdict.stable_requests) == (100, 300)
    assert "ratio 10.00 > max_p99_ratio 1.5" in verdict.reason


async def test_only_the_canary_window_counts_for_the_stable_side() -> None:
    stable, new = version("1"), version("2")
    answer(stable, *[50.0] * 200)  # slow before the canary started: not its baseline
    answer(new, 40.0)  # the canary's golden check, before it takes traffic
    canary = Canary(new, stable, CanaryPolicy(min_requests=10))
    assert canary.judge(stable) is None
    answer(stable, *[2.0] * 90)
    answer(new, *[2.0] * 10)
    verdict = canary.judge(stable)
    assert verdict is not None and verdict.outcome == PROMOTED
    assert verdict.p99_ratio == pytest.approx(1.0)
    assert (verdict.canary_requests, verdict.stable_requests, verdict.canary_faults) == (10, 90, 0)
    figures = verdict.figures()
    assert figures["outcome"] == "promoted" and figures["p99_ratio"] == 1.0


async def test_errors_decide_as_soon_as_min_requests_could_not_bring_the_rate_back() -> None:
    stable, new = version("1"), version("2")
    canary = Canary(new, stable, CanaryPolicy(min_requests=200, max_error_rate=0.01))
    answer(new, *[1.0] * 10, failed=2)  # 2 faults: 1% of 200 is still reachable
    assert canary.judge(stable) is None
    answer(new, failed=1)  # 3 > 2: no 200-request window can be under 1% any more
    verdict = canary.judge(stable)
    assert verdict is not None and verdict.outcome == ROLLED_BACK
    assert (verdict.canary_requests, verdict.canary_faults) == (13, 3)
    assert "more than 1.0% of 200" in verdict.reason


@pytest.mark.parametrize(
    ("without_traffic", "failed", "outcome"),
    [("promote", 0, PROMOTED), ("rollback", 0, ROLLED_BACK), ("promote", 1, ROLLED_BACK)],
)
async def test_at_max_seconds_what_was_seen_is_checked_then_the_rule_decides(
    without_traffic: str, failed: int, outcome: str
) -> None:
    stable, new = version("1"), version("2")
    policy = CanaryPolicy(min_requests=200, without_traffic=without_traffic)
    canary = Canary(new, stable, policy)
    answer(new, 1.0, 1.0, failed=failed)
    verdict = canary.time_out(stable)
    assert (verdict.outcome, verdict.decided_by) == (outcome, "max_seconds")
    assert verdict.stable_p99_ms is None and verdict.p99_ratio is None  # no stable traffic


def test_the_percentile_is_numpys() -> None:
    stats = ModelStats(latency_samples=8)
    mark = stats.latency_mark()
    for ms in range(1, 11):
        stats.record_request(True, ms * MS)
    stats.record_request(False, 999 * MS, server_fault=True)  # failures are not latencies
    samples = stats.latencies_since(mark)
    assert samples.tolist() == [ms * MS for ms in range(3, 11)]
    assert np.percentile(samples, 99) == pytest.approx(9.93 * MS)
