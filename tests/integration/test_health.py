"""``edgeagent health`` against a real agent: exit 0 ready, 1 with one line why otherwise."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from devtools.agent_process import Agent
from tests.support.helpers import REPO, write_tiny_package


def health(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "edgeagent.cli", "health", *args],
        capture_output=True, text=True, timeout=60, cwd=cwd, env=env,
    )  # fmt: skip


def config_serving(tmp_path: Path, models: Path) -> Path:
    config = tmp_path / "agent.toml"
    config.write_text(f'[agent]\nmodels_dir = "{models}"\n')
    return config


def test_ready_agent_is_exit_0_and_a_stopped_one_exit_1(tmp_path: Path) -> None:
    models = write_tiny_package(tmp_path / "models" / "tiny").parent
    agent = Agent(tmp_path, config_serving(tmp_path, models))
    try:
        ready = health("--socket", str(agent.socket), cwd=tmp_path)
        assert ready.returncode == 0, ready.stderr
        assert ready.stdout == f"ready: {agent.socket}\n"
        # The socket needs no token: a token file this caller cannot read is not its concern.
        unreadable = tmp_path / "operator.toml"
        unreadable.write_text('[server]\ntoken_file = "/nonexistent/root-only-token"\n')
        given = health("--socket", str(agent.socket), "--config", str(unreadable), cwd=tmp_path)
        assert given.returncode == 0, given.stderr
    finally:
        assert agent.stop() == 0
    down = health("--socket", str(agent.socket), "--timeout", "2", cwd=tmp_path)
    assert down.returncode == 1
    assert down.stderr.startswith("edgeagent health: not ready: cannot reach the agent at")
    assert down.stderr.count("\n") == 1  # one line, for `docker inspect` and the journal


def test_an_agent_serving_nothing_is_not_ready(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    agent = Agent(tmp_path, config_serving(tmp_path, tmp_path / "empty"))
    try:
        result = health("--socket", str(agent.socket), cwd=tmp_path)
    finally:
        agent.stop()
    assert result.returncode == 1
    assert result.stderr == (
        f"edgeagent health: not ready: {agent.socket}: no model is ready to serve yet\n"
    )


def test_a_bad_config_is_exit_1_not_2_which_docker_reserves(tmp_path: Path) -> None:
    bad = tmp_path / "agent.toml"
    bad.write_text("[server]\ntcp_port = -1\n")
    result = health("--config", str(bad), cwd=tmp_path)
    assert result.returncode == 1 and "[server] tcp_port" in result.stderr


def test_the_socket_comes_from_the_config_as_for_status(tmp_path: Path) -> None:
    """No --socket: found where the config (here $RUNTIME_DIRECTORY) puts it."""
    (tmp_path / "agent.toml").write_text("")
    result = subprocess.run(
        [sys.executable, "-m", "edgeagent.cli", "health", "--config", str(tmp_path / "agent.toml")],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO), "RUNTIME_DIRECTORY": str(tmp_path)},
    )  # fmt: skip
    assert result.returncode == 1
    assert f"cannot reach the agent at {tmp_path}/agent.sock" in result.stderr


def test_model_asks_about_one_model_and_wait_outlasts_a_reload(tmp_path: Path) -> None:
    """``systemctl reload`` returns when the signal is sent; ``--model --wait`` is how a script
    waits for the package it just installed, where one question answers "not ready"."""
    models = tmp_path / "models"
    models.mkdir()
    agent = Agent(tmp_path, config_serving(tmp_path, models))
    try:
        once = health("--socket", str(agent.socket), "--model", "tiny", cwd=tmp_path)
        assert once.returncode == 1
        assert once.stderr == (
            f"edgeagent health: not ready: {agent.socket}: model tiny is not ready to serve yet\n"
        )
        waiting = subprocess.Popen(
            [sys.executable, "-m", "edgeagent.cli", "health", "--socket", str(agent.socket),
             "--model", "tiny", "--wait", "120"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )  # fmt: skip
        write_tiny_package(models / "tiny")
        agent.process.send_signal(signal.SIGHUP)
        out, err = waiting.communicate(timeout=180)
        assert waiting.returncode == 0, err
        assert out == f"ready: model tiny at {agent.socket}\n"
    finally:
        agent.stop()


def test_wait_must_be_a_sane_number_of_seconds(tmp_path: Path) -> None:
    for bad in ("soon", "-1", "1e9"):
        refused = health("--wait", bad, cwd=tmp_path)
        assert refused.returncode == 2 and "--wait" in refused.stderr, (bad, refused.stderr)
