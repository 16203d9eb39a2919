"""``edgeagent run`` in a child process, as an operator starts it, for CLI-level tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from edgeagent.api.client import AgentClient
from tests.support.helpers import REPO


class Agent:
    """``edgeagent run`` in a process; its log lines are read as they come (the sync point)."""

    def __init__(self, tmp_path: Path, config: Path, port: int = 0) -> None:
        """``port``: the TCP listener's (0: none, the socket only), for clients that need one."""
        env = {**os.environ, "PYTHONPATH": str(REPO), "XDG_STATE_HOME": str(tmp_path / "state")}
        env.pop("JOURNAL_STREAM", None)
        self.socket = tmp_path / "agent.sock"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "edgeagent.cli", "run", "--config", str(config),
             "--socket", str(self.socket), "--port", str(port)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env,
        )  # fmt: skip
        assert self.process.stdout is not None
        first = self.process.stdout.readline()
        assert first.startswith("edgeagent serving"), first + self._rest()
        self.client = AgentClient(socket_path=self.socket)

    def _rest(self) -> str:
        self.process.kill()
        return self.process.communicate()[1]

    def hup_and_wait_for(self, fragment: str) -> str:
        """Send SIGHUP and read the log until a line with ``fragment``; returns that line."""
        self.process.send_signal(signal.SIGHUP)
        assert self.process.stderr is not None
        for line in self.process.stderr:
            if fragment in line:
                return line
        raise AssertionError(f"the agent exited without logging {fragment!r}")

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=60)
