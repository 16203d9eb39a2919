"""The probe runs a golden batch row by row: same answers, and the session never sees more."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgeagent.hardware.probe import run_rows
from edgeagent.runtimes import LoadRequest, get_runtime
from tests.support.helpers import write_tiny_onnx


class Recording:
    """A real onnxruntime session that remembers the batch size of every run."""

    def __init__(self, path: Path) -> None:
        self.session = get_runtime("onnxruntime").load(LoadRequest(files=(path,)))
        self.batches: list[int] = []

    def run(self, feeds):
        self.batches.append(len(next(iter(feeds.values()))))
        return self.session.run(feeds)


def test_a_golden_batch_runs_one_row_at_a_time_with_the_batch_answers(tmp_path: Path) -> None:
    path = tmp_path / "tiny.onnx"
    write_tiny_onnx(path, classes=5, size=8)
    session = Recording(path)
    batch = np.random.default_rng(3).standard_normal((4, 3, 8, 8)).astype(np.float32)
    whole = session.session.run({"input": batch})
    rows = run_rows(session, {"input": batch})  # type: ignore[arg-type]
    assert session.batches == [1, 1, 1, 1]
    assert set(rows) == set(whole)
    for name, value in whole.items():
        np.testing.assert_allclose(rows[name], value, rtol=1e-6, atol=1e-6)
    session.batches.clear()
    run_rows(session, {"input": batch[:1]})  # type: ignore[arg-type]
    assert session.batches == [1]


def test_an_output_without_a_batch_axis_gets_one_run_of_the_whole_batch() -> None:
    seen: list[int] = []

    class Summing:
        def run(self, feeds):
            seen.append(len(feeds["x"]))
            return {"total": np.asarray(feeds["x"].sum())}

    answer = run_rows(Summing(), {"x": np.arange(6.0).reshape(3, 2)})  # type: ignore[arg-type]
    assert float(answer["total"]) == 15.0 and seen[-1] == 3
