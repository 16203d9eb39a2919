"""The socket's directory must be the agent's own (issue 10 #13): the fallback under /tmp can be
created by any user first, and whoever owns it can replace the socket and answer as the agent."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from devtools.agent_process import running_daemon
from tests.support.helpers import REPO, write_tiny_package


def _start(tmp_path: Path, sock: Path) -> subprocess.CompletedProcess:
    models = write_tiny_package(tmp_path / "models" / "tiny").parent
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state"), "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "edgeagent.cli", "run", "--models-dir", str(models)]
    command += ["--socket", str(sock), "--port", "0"]
    return subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path
    )


@pytest.mark.skipif(os.geteuid() != 0, reason="making a directory another user's needs root")
def test_a_directory_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    planted = tmp_path / "edgeagent-0"
    planted.mkdir(mode=0o700)
    os.chown(planted, 12345, 12345)
    result = _start(tmp_path, planted / "agent.sock")
    assert result.returncode == 1, result.stderr
    assert "belongs to uid 12345" in result.stderr and "--socket" in result.stderr
    assert not (planted / "agent.sock").exists()


def test_a_symbolic_link_for_the_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    result = _start(tmp_path, tmp_path / "link" / "agent.sock")
    assert result.returncode == 1 and "not a plain directory" in result.stderr


def test_our_own_directory_left_writable_to_others_is_tightened(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    run.chmod(0o777)
    with running_daemon(tmp_path) as daemon:
        assert daemon.socket.is_socket()
        assert stat.S_IMODE(run.stat().st_mode) & 0o022 == 0
