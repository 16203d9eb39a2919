"""A service manager for tests that behaves like systemd for the agent's unit (A/B drop-in).

``Type=notify`` (READY over ``$NOTIFY_SOCKET``), ``ExecStartPre=<root>/boot-check``,
``ExecStart=<root>/current/venv/bin/edgeagent run``, ``Restart=always`` whatever the exit
status (the drop-in empties ``RestartPreventExitStatus``), ``TimeoutStartSec``
(a start that sends no READY in time is killed, as systemd does), and ``systemctl stop``.
Every start is recorded (version, pid, READY or not, exit status) so tests can wait on what a
real device would go through; ``extra_env`` adds variables to chosen starts only (crash hooks).
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Start:
    number: int
    version: str | None
    pid: int
    ready: bool = False
    returncode: int | None = None


class Supervisor:
    """Run the A/B agent under ``root`` with ``args`` until ``stop()``."""

    def __init__(
        self,
        root: Path,
        args: list[str],
        *,
        log: Path,
        start_timeout_s: float = 20.0,
        extra_env: Mapping[int, Mapping[str, str]] | None = None,
    ) -> None:
        self.root = root
        self.args = args
        self.log = log
        self.start_timeout_s = start_timeout_s
        self.extra_env = dict(extra_env or {})
        self.starts: list[Start] = []
        self.boot_checks: list[str] = []
        self._stopping = threading.Event()
        self._process: subprocess.Popen | None = None
        self._notify_path = root.parent / f"{root.name}.notify"
        self._thread = threading.Thread(target=self._run, name="supervisor", daemon=True)

    def start(self) -> Supervisor:
        self._thread.start()
        return self

    def _env(self, number: int) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("EDGEAGENT_UPDATE_")}
        env.pop("PYTHONPATH", None)  # the versions run their own code, not this checkout's
        env["NOTIFY_SOCKET"] = str(self._notify_path)
        env.update(self.extra_env.get(number, {}))
        return env

    def _run(self) -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify, self.log.open("a") as log:
            self._notify_path.unlink(missing_ok=True)
            notify.bind(str(self._notify_path))
            while not self._stopping.is_set():
                self._one_start(notify, log)

    def _one_start(self, notify: socket.socket, log) -> None:
        number = len(self.starts) + 1
        check = subprocess.run(
            [str(self.root / "boot-check")], capture_output=True, text=True, timeout=120
        )
        self.boot_checks.append(check.stdout + check.stderr)
        log.write(f"--- start {number}: {check.stdout}{check.stderr}")
        log.flush()
        try:
            version: str | None = Path(os.readlink(self.root / "current")).name
        except OSError:
            version = None
        process = subprocess.Popen(
            [str(self.root / "current" / "venv" / "bin" / "edgeagent"), *self.args],
            stdout=log,
            stderr=log,
            env=self._env(number),
            start_new_session=True,
        )
        self._process = process
        record = Start(number, version, process.pid)
        self.starts.append(record)
        record.ready = self._watch_for_ready(notify, process)
        if not record.ready and process.poll() is None:  # TimeoutStartSec: systemd kills it
            process.send_signal(signal.SIGKILL)
        record.returncode = process.wait()

    def _watch_for_ready(self, notify: socket.socket, process: subprocess.Popen) -> bool:
        """READY=1 from this process within the start timeout (False: it exited or hung)."""
        deadline = time.monotonic() + self.start_timeout_s
        while (
            time.monotonic() < deadline and process.poll() is None and not self._stopping.is_set()
        ):
            readable, _, _ = select.select([notify], [], [], 0.2)  # a datagram, or a look at it
            if readable and b"READY=1" in notify.recv(4096):
                return True
        return False

    def stop(self) -> None:
        """``systemctl stop``: SIGTERM the agent, no restart."""
        self._stopping.set()
        process = self._process
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
        self._thread.join(timeout=60)
        self._notify_path.unlink(missing_ok=True)

    def serving(self) -> Start | None:
        """The start that is running and reached READY, if any."""
        last = self.starts[-1] if self.starts else None
        return last if last is not None and last.ready and last.returncode is None else None
