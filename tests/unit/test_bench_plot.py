"""`bench --plot`: a plot that starts at 0 and shows the tail, or a clear refusal up front."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from edgeagent.commands.bench import BenchResult, write_plot
from tests.support.helpers import REPO, write_tiny_package


def _result(runtime: str, device: str, latencies: list[float]) -> BenchResult:
    ordered = sorted(latencies)
    return BenchResult(
        variant=f"{runtime}:{device}:fp32", runtime=runtime, device=device, precision="fp32",
        batch=4, iterations=len(ordered), p50_ms=ordered[len(ordered) // 2],
        p90_ms=ordered[int(len(ordered) * 0.9)], p99_ms=ordered[-1], throughput_ips=1.0,
        peak_rss_mb=1.0, latencies_ms=latencies,
    )  # fmt: skip


def test_the_plot_starts_at_zero_marks_p99_and_names_batch_host_and_devices(
    tmp_path: Path,
) -> None:
    plt = pytest.importorskip("matplotlib.pyplot")
    slow_tail = [10.0] * 98 + [40.0, 90.0]
    results = [_result("onnxruntime", "CPUExecutionProvider", slow_tail),
               _result("openvino", "GPU", [5.0] * 100)]  # fmt: skip
    write_plot(tmp_path / "plot.png", "tiny", results)
    assert (tmp_path / "plot.png").stat().st_size > 0
    axis = plt.gcf().axes[0]
    assert axis.get_ylim()[0] == 0
    assert axis.get_ylim()[1] >= 90  # the outlier is inside the picture
    title = axis.get_title()
    assert "batch 4" in title and platform.node() in title
    labels = [label.get_text() for label in axis.get_xticklabels()]
    assert "CPUExecutionProvider" in labels[0] and "GPU" in labels[1]
    assert [t.get_text() for t in axis.get_legend().get_texts()] == ["p99"]
    plt.close("all")


def test_without_matplotlib_it_says_so_and_exits_2_before_benchmarking(tmp_path: Path) -> None:
    hidden = tmp_path / "hide"
    (hidden / "matplotlib").mkdir(parents=True)
    (hidden / "matplotlib" / "__init__.py").write_text("raise ImportError('not installed')\n")
    package = write_tiny_package(tmp_path / "tiny")
    result = subprocess.run(
        [sys.executable, "-m", "edgeagent.cli", "bench", str(package), "--plot",
         str(tmp_path / "p.png")],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": f"{hidden}{os.pathsep}{REPO}"},
    )  # fmt: skip
    assert result.returncode == 2
    assert "pip install 'edgeagent[plot]'" in result.stderr
    assert "[1/" not in result.stderr  # no variant was timed first
