"""`edgeagent status` against a live agent: a summary by default, the whole document with --json."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from devtools.agent_process import Agent, spawn_agent
from edgeagent.commands.status import latency_by_version
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


def _agent_in(tmp_path: Path, env: dict[str, str]) -> subprocess.Popen:
    """``edgeagent run`` with its default socket, as a shell with ``env`` starts it."""
    write_tiny_package(tmp_path / "models" / "tiny")
    config = tmp_path / "agent.toml"
    config.write_text(f'[agent]\nmodels_dir = "{tmp_path / "models"}"\n')
    process = spawn_agent(
        ["--config", str(config), "--port", "0"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
    )  # fmt: skip
    assert process.stdout is not None
    first = process.stdout.readline()
    if not first.startswith("edgeagent serving"):
        process.kill()
        pytest.fail(first + process.communicate()[1])
    return process


def test_socket_path_prints_the_default_socket_a_shell_can_hand_to_curl(tmp_path: Path) -> None:
    """The README's ``curl --unix-socket "$(edgeagent status --socket-path)"``: the same path
    the agent computed, whatever the shell's variables (here the login session's
    $XDG_RUNTIME_DIR), so no command depends on one being set."""
    runtime = tmp_path / "xdg"
    runtime.mkdir(mode=0o700)
    env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_RUNTIME_DIR": str(runtime),
           "XDG_STATE_HOME": str(tmp_path / "state")}  # fmt: skip
    for name in ("RUNTIME_DIRECTORY", "JOURNAL_STREAM"):
        env.pop(name, None)
    agent = _agent_in(tmp_path, env)
    try:
        config = str(tmp_path / "agent.toml")
        result = subprocess.run(
            [sys.executable, "-m", "edgeagent.cli", "status", "--config", config, "--socket-path"],
            capture_output=True, text=True, timeout=120, env=env,
        )  # fmt: skip
        assert (result.returncode, result.stderr) == (0, "")
        assert result.stdout == f"{runtime / 'edgeagent' / 'agent.sock'}\n"
        line = (
            f'curl -sf --unix-socket "$({sys.executable} -m edgeagent.cli status --config '
            f'{config} --socket-path)" -o /dev/null -w "%{{http_code}}" '
            "http://agent/v2/models/tiny/ready"
        )
        if shutil.which("curl"):
            answer = subprocess.run(["sh", "-c", line], capture_output=True, text=True, env=env,
                                    timeout=120)  # fmt: skip
            assert answer.stdout == "200", answer.stderr
    finally:
        agent.terminate()
        assert agent.wait(timeout=60) == 0


def test_socket_path_with_no_agent_there_says_so_and_exits_1(tmp_path: Path) -> None:
    socket = tmp_path / "run" / "agent.sock"
    config = tmp_path / "agent.toml"
    config.write_text(f'[server]\nunix_socket = "{socket}"\n')
    result = _status("--config", str(config), "--socket-path")
    assert result.returncode == 1
    assert result.stdout == f"{socket}\n"  # still printed: the path a user then looks for
    assert f"no agent socket at {socket}" in result.stderr
    both = _status("--url", "http://127.0.0.1:1", "--socket-path")
    assert both.returncode == 2 and "exclude each other" in both.stderr
