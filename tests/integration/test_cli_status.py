"""`edgeagent status` against a live agent: a summary by default, the whole document with --json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from edgeagent.commands.status import latency_by_version
from tests.support.agent_process import Agent
from tests.support.helpers import REPO, write_tiny_package


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[Agent]:
    write_tiny_package(tmp_path / "models" / "tiny")
    config = tmp_path / "agent.toml"
    config.write_text(f'[agent]\nmodels_dir = "{tmp_path / "models"}"\n')
    running = Agent(tmp_path, config)
    yield running
    assert running.stop() == 0


def _status(*args: str, columns: int = 200) -> subprocess.CompletedProcess:
    """``edgeagent status`` on a terminal ``columns`` wide (wide enough for whole cells)."""
    return subprocess.run(
        [sys.executable, "-m", "edgeagent.cli", "status", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": str(columns)},
    )


def test_the_summary_names_board_backend_requests_and_governor(agent: Agent) -> None:
    for _ in range(3):
        agent.client.infer("tiny", {"input": np.zeros((1, 3, 8, 8), dtype=np.float32)})
    result = _status("--socket", str(agent.socket))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) <= 10, result.stdout  # a summary, not the document
    assert lines[1].startswith("board     generic-")
    (row,) = [line for line in lines if line.split()[:2] in (["tiny", "1"], ["models", "tiny"])]
    cells = row.split()
    assert "onnxruntime/CPUExecutionProvider/fp32" in cells and "READY" in cells
    assert cells[-2] == "3" and float(cells[-1]) > 0  # requests, p50 ms
    assert any(line.startswith("governor  normal") for line in lines)
    assert any(line.startswith("updates   disabled") for line in lines)


def test_an_80_column_terminal_gets_the_table_cut_to_fit(agent: Agent) -> None:
    lines = _status("--socket", str(agent.socket), columns=80).stdout.splitlines()
    table = [line for line in lines if line.startswith(("models", " " * 10))]
    assert table and all(len(line) <= 80 for line in table), lines
    assert any(cell.endswith("…") for cell in table[1].split()), table  # the backend, cut


def test_json_is_the_whole_status_document(agent: Agent) -> None:
    result = _status("--socket", str(agent.socket), "--json")
    document = json.loads(result.stdout)
    assert {"agent", "profile", "models", "governor"} <= set(document)
    assert document["models"]["tiny"]["state"] == "READY"


def test_an_unreachable_agent_is_exit_2(tmp_path: Path) -> None:
    result = _status("--socket", str(tmp_path / "none.sock"))
    assert result.returncode == 2 and "cannot reach the agent" in result.stderr


def test_the_median_is_interpolated_within_its_bucket() -> None:
    text = "\n".join(
        [
            "# TYPE edgeagent_inference_latency_seconds histogram",
            *(
                f'edgeagent_inference_latency_seconds_bucket{{model="m",version="1",'
                f'backend="b",le="{le}"}} {count}'
                for le, count in (("0.001", 0), ("0.002", 2), ("0.004", 4), ("+Inf", 4))
            ),
            'edgeagent_inference_latency_seconds_count{model="m",version="1",backend="b"} 4',
            'edgeagent_inference_latency_seconds_sum{model="m",version="1",backend="b"} 0.01',
            "",
        ]
    )
    count, p50 = latency_by_version(text)[("m", "1")]
    assert count == 4 and p50 == pytest.approx(2.0)
