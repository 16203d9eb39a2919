"""bench_instances.py's smoke test: both halves run and report their figures (issue 28)."""

from __future__ import annotations

from tests.integration.test_benches import assert_figures, run_bench
from tests.support.helpers import write_tiny_package


def test_instances_bench_reports_simulated_and_pinned_figures(tmp_path) -> None:
    package = write_tiny_package(tmp_path / "tiny")
    report = run_bench(
        f"bench_instances.py --package {package} --precision fp32 --duration 0.1 --rounds 1 "
        "--fast-ms 2 --slow-ms 4 --concurrency 4 --batch 2"
    )
    simulated = report["simulated"]
    assert_figures(simulated, "two 2 ms.over_one", "2 + 4 ms.rows_per_s", "ideal_unequal")
    assert all(simulated["two 2 ms"]["batches_per_instance"])  # both devices served
    [two] = [name for name in report["pinned_cpu"] if name.startswith("two instances")]
    assert_figures(report["pinned_cpu"][two], "rows_per_s")
    assert_figures(report["pinned_cpu"]["in_process"], "one_rows_per_s", "over_one")
