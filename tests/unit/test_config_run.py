"""Config validation through `edgeagent run`: a bad key or value names itself, exit status 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgeagent.cli import main
from edgeagent.config import parse_config
from tests.support.helpers import REPO, write_tiny_package


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ("[server]\nmax_queu = 3\n", "[server] unknown key(s) max_queu"),
        ("[server]\nmax_queue = 0\n", "[server] max_queue: must be positive"),
        ("[server]\nmax_queue = 'many'\n", "[server] max_queue: must be an integer"),
        ("[server]\nmax_batch_size = 0\n", "[server] max_batch_size: must be at least 1"),
        (
            "[server]\nmax_queue_delay_ms = -1\n",
            "[server] max_queue_delay_ms: must not be negative",
        ),
        ("[server]\nworker_threads = 0\n", "[server] worker_threads: must be at least 1"),
        ("[server]\ndrain_timeout_s = -5\n", "[server] drain_timeout_s: must not be negative"),
        ("[server]\ntcp_host = '0.0.0.0'\n", "[server] token: must be set"),
        ("[agent]\nlog_level = 'LOUD'\n", "[agent] log_level"),
        ("[servers]\n", "unknown section(s) servers"),
        ("[server\n", "not valid TOML"),
    ],
)
def test_bad_config_names_the_key_and_exits_2(tmp_path: Path, capsys, toml, message):
    config = tmp_path / "agent.toml"
    config.write_text(toml)
    assert main(["run", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert message in err and str(config) in err


def test_bad_flag_value_is_refused(capsys):
    assert main(["run", "--config", os.devnull, "--port", "70000"]) == 2
    assert "[server] tcp_port: must be 0..65535" in capsys.readouterr().err


def test_missing_config_file_is_named(tmp_path: Path, capsys):
    assert main(["run", "--config", str(tmp_path / "nope.toml")]) == 2
    assert "nope.toml: cannot read config" in capsys.readouterr().err


def test_named_model_missing_from_models_dir(tmp_path: Path, capsys):
    write_tiny_package(tmp_path / "models" / "tiny")
    config = tmp_path / "agent.toml"
    config.write_text(
        f"[agent]\nmodels_dir = '{tmp_path / 'models'}'\nmodels = ['tiny', 'resnet']\n"
        f"[server]\nunix_socket = '{tmp_path / 'a.sock'}'\ntcp_port = 0\n"
    )
    assert main(["run", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "[agent] models: no package 'resnet'" in err and "found: tiny" in err


def test_every_key_has_a_default():
    config = parse_config("", "<empty>")
    assert config.server.tcp_port == 8080 and config.engine.max_batch_size is None
    assert config.engine.default_priority == 2 and config.engine.warmup


def test_exit_status_through_a_real_process(tmp_path: Path):
    config = tmp_path / "agent.toml"
    config.write_text("[server]\nrequest_timeout_s = 0\n")
    result = subprocess.run(
        [sys.executable, "-m", "edgeagent.cli", "run", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 2
    assert "[server] request_timeout_s: must be positive" in result.stderr


def test_unusable_state_directory_is_a_start_failure(tmp_path: Path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    config = tmp_path / "agent.toml"
    config.write_text(
        f"[agent]\nstate_dir = '{blocker / 'state'}'\nmodels_dir = '{tmp_path}'\n"
        f"[server]\nunix_socket = '{tmp_path / 'a.sock'}'\ntcp_port = 0\n"
    )
    assert main(["run", "--config", str(config)]) == 1
    err = capsys.readouterr().err
    assert "cannot start" in err and str(blocker) in err
