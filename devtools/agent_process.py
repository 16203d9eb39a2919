"""``edgeagent run`` as a child process: the one place tests and benchmarks start the agent.

Every caller starts it the way an operator does (``python -m edgeagent.cli run …``) through
``spawn_agent`` (or ``spawn_agent_async`` on an event loop), so the command line and the
environment a child agent gets are written once: this checkout first on ``PYTHONPATH``, its own
state directory, and none of the service-manager variables the test runner may have inherited
(an agent that found ``NOTIFY_SOCKET`` would talk to the runner's manager, not the test's).

On top of it, the ready-made shapes the suite and the benchmarks use:

- ``running_daemon``: the tiny package on a Unix socket and a loopback TCP port with tokens,
  ready once it printed every ``listening on`` line; its standard error goes to a file.
- ``Agent``: a given config, ready at its ``edgeagent serving`` line; SIGHUP and read the log.

Benchmarks start theirs through ``devtools.bench_daemon``, which builds on ``spawn_agent``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devtools.ports import free_port
from devtools.tiny import write_tiny_package
from edgeagent.api.client import AgentClient

REPO = Path(__file__).resolve().parents[1]

TOKEN = "daemon-test-token"
ADMIN_TOKEN = "daemon-test-admin-token"

# What a service manager hands the processes it starts; a child agent must not inherit the
# test runner's (a test that plays the manager passes its own through ``extra_env``).
MANAGER_VARIABLES = ("NOTIFY_SOCKET", "WATCHDOG_PID", "WATCHDOG_USEC", "JOURNAL_STREAM")


def agent_env(
    state: Path | None = None, extra_env: Mapping[str, str] | None = None
) -> dict[str, str]:
    """This process's environment for a child agent: the checkout first on the path, ``state``
    as its XDG_STATE_HOME (None: the config names one), then ``extra_env``."""
    env = {k: v for k, v in os.environ.items() if k not in MANAGER_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    if state is not None:
        env["XDG_STATE_HOME"] = str(state)
    env.update(extra_env or {})
    return env


def agent_argv(args: Sequence[str], options: Sequence[str] = ()) -> list[str]:
    """``edgeagent [options] run [args]`` by this interpreter; ``options`` are global (``-v``)."""
    return [sys.executable, "-m", "edgeagent.cli", *options, "run", *args]


def spawn_agent(
    args: Sequence[str],
    *,
    state: Path | None = None,
    extra_env: Mapping[str, str] | None = None,
    env: Mapping[str, str] | None = None,
    options: Sequence[str] = (),
    prefix: Sequence[str] = (),
    **popen: Any,
) -> subprocess.Popen:
    """Start ``edgeagent run args``; ``popen`` holds Popen's other arguments (cwd, stdout …).

    ``env`` replaces the whole environment (a test of what a shell's variables do);
    ``prefix`` goes before the interpreter (another user's identity, for instance).
    """
    environment = dict(env) if env is not None else agent_env(state, extra_env)
    command = [*prefix, *agent_argv(args, options)]
    return subprocess.Popen(command, env=environment, **popen)


async def spawn_agent_async(
    args: Sequence[str],
    *,
    state: Path | None = None,
    extra_env: Mapping[str, str] | None = None,
    **kwargs: Any,
) -> asyncio.subprocess.Process:
    """``spawn_agent`` for a caller on an event loop: an asyncio process, read without blocking."""
    environment = agent_env(state, extra_env)
    return await asyncio.create_subprocess_exec(*agent_argv(args), env=environment, **kwargs)


# ---------------------------------------------------------------------------------------------
# The tiny package with tokens on a socket and a TCP port (attack and HTTP tests, fuzzing, soak)


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
    args = ["--config", str(config), "--models-dir", str(models), "--socket", str(sock)]
    with log.open("w") as stderr:
        process = spawn_agent(
            args,
            state=root / "state",
            cwd=root,
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


# ---------------------------------------------------------------------------------------------
# A given config, for CLI-level tests


class Agent:
    """``edgeagent run`` in a process; its log lines are read as they come (the sync point)."""

    def __init__(self, tmp_path: Path, config: Path, port: int = 0) -> None:
        """``port``: the TCP listener's (0: none, the socket only), for clients that need one."""
        self.socket = tmp_path / "agent.sock"
        self.process = spawn_agent(
            ["--config", str(config), "--socket", str(self.socket), "--port", str(port)],
            state=tmp_path / "state",
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
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
        return self.wait_for(fragment)

    def wait_for(self, fragment: str) -> str:
        """Read the log until a line with ``fragment``; returns that line."""
        assert self.process.stderr is not None
        for line in self.process.stderr:
            if fragment in line:
                return line
        raise AssertionError(f"the agent exited without logging {fragment!r}")

    def stop(self) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=60)
