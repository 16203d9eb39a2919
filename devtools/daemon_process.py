"""The agent as a real process on a Unix socket and a loopback TCP port, for attack tests.

Started with ``edgeagent run`` exactly as an operator would; ready once it has printed every
``listening on`` line. Its standard error goes to a file so a test can read the log afterwards.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from devtools.ports import free_port
from devtools.tiny import write_tiny_package

REPO = Path(__file__).resolve().parents[1]

TOKEN = "daemon-test-token"
ADMIN_TOKEN = "daemon-test-admin-token"


@dataclass
class RunningDaemon:
    process: subprocess.Popen
    socket: Path
    url: str
    log: Path

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {TOKEN}"}

    def alive(self) -> bool:
        return self.process.poll() is None


@contextmanager
def running_daemon(
    root: Path, server: str = "", preexec_fn: Callable[[], None] | None = None
) -> Iterator[RunningDaemon]:
    """The daemon serving the tiny package; ``server`` adds lines to its [server] table."""
    models = write_tiny_package(root / "models" / "tiny").parent
    port = free_port()
    config = root / "agent.toml"
    config.write_text(
        f'[server]\ntcp_port = {port}\ntoken = "{TOKEN}"\nadmin_token = "{ADMIN_TOKEN}"\n{server}'
    )
    sock = root / "run" / "agent.sock"
    log = root / "daemon.log"
    env = {
        **os.environ,
        "XDG_STATE_HOME": str(root / "state"),
        "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
    }
    env.pop("NOTIFY_SOCKET", None)
    command = [sys.executable, "-m", "edgeagent.cli", "run", "--config", str(config)]
    command += ["--models-dir", str(models), "--socket", str(sock)]
    with log.open("w") as stderr:
        process = subprocess.Popen(
            command,
            cwd=root,
            env=env,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            preexec_fn=preexec_fn,
        )
    try:
        assert process.stdout is not None
        listening = 0
        for line in process.stdout:
            listening += "listening on" in line
            if listening == 2:
                break
        else:
            raise AssertionError(f"the daemon exited {process.wait()}: {log.read_text()}")
        yield RunningDaemon(process, sock, f"http://127.0.0.1:{port}", log)
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stdout is not None:
            process.stdout.close()
