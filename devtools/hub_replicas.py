"""Hub server replicas for tests and the fleet benchmark: N ``edgeagent hub server`` processes
on one database, each its own MQTT session, and who among them leads the rollout controller.

Each replica's output is read on a thread into ``lines`` (a pipe nobody reads fills up and
stops the server), so a test waits for a line (``wait_line``) rather than for a guessed time.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from typing import Any

from sqlalchemy.ext.asyncio import create_async_engine

from devtools.waiting import until
from edgeagent.fleet.settings import MqttSettings
from edgeagent.hub.server.leadership import current_holder
from edgeagent.hub.server.settings import normalise_database_url


class Replica:
    """One ``hub server`` process named ``name`` (its MQTT client id)."""

    def __init__(self, name: str, database_url: str, mqtt: MqttSettings, *extra: str) -> None:
        self.name = name
        self.command = [
            *(sys.executable, "-m", "edgeagent.cli", "hub", "server"),
            *("--db", database_url, "--port", "0", "--open"),
            *("--broker", f"{mqtt.host}:{mqtt.port}", "--client-id", name),
            *extra,
        ]
        self.process: subprocess.Popen[str] | None = None
        self.lines: list[str] = []
        self.url = ""
        self._reader: threading.Thread | None = None

    async def start(self) -> str:
        """Start it; its URL once it printed that it listens."""
        self.process = subprocess.Popen(
            self.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()
        await self.wait_line("hub server listening on ", timeout=60)
        line = next(x for x in self.lines if x.startswith("hub server listening on "))
        self.url = line.split()[-1]
        return self.url

    def _drain(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)

    async def wait_line(self, text: str, timeout: float = 30.0) -> str:
        """The first line of its output containing ``text`` (waits for it)."""

        def found() -> bool:
            if any(text in line for line in self.lines):
                return True
            if self.process is not None and self.process.poll() is not None:
                raise AssertionError(f"{self.name} exited:\n{''.join(self.lines[-40:])}")
            return False

        await until(found, timeout, what=f"{self.name} saying {text!r}")
        return next(line for line in self.lines if text in line)

    def send(self, sig: int) -> None:
        assert self.process is not None
        self.process.send_signal(sig)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        """Stop it (SIGKILL: as a crash) and return its exit code, once ``lines`` holds all
        it printed."""
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)  # a paused one must run to stop
            self.process.send_signal(sig)
        code = self.process.wait(30)
        if self._reader is not None:
            self._reader.join(10)
        return code


async def leader(database_url: str) -> tuple[str, int]:
    """The replica (client id) that holds the controller's lease now, and its token."""
    engine = create_async_engine(normalise_database_url(database_url))
    try:
        async with engine.connect() as connection:
            holder, token = await current_holder(connection)
    finally:
        await engine.dispose()
    return holder.split("/")[0], token


async def new_leader(database_url: str, not_token: int, timeout: float = 30.0) -> tuple[str, int]:
    """Wait until another lease than ``not_token`` is held; returns (replica, token)."""
    found: list[tuple[str, int]] = []

    async def taken() -> bool:
        found[:] = [await leader(database_url)]
        return found[0][1] != not_token and bool(found[0][0])

    await until(taken, timeout, poll_s=0.1, what="another replica taking the lease")
    return found[0]


@contextlib.asynccontextmanager
async def replicas(
    database_url: str, mqtt: MqttSettings, count: int, *extra: str, **names: Any
) -> AsyncIterator[dict[str, Replica]]:
    """``count`` replicas ``hub-1``… started together; stopped (killed if need be) after."""
    prefix = names.get("prefix", "hub")
    started = {
        f"{prefix}-{i}": Replica(f"{prefix}-{i}", database_url, mqtt, *extra)
        for i in range(1, count + 1)
    }
    try:
        await asyncio.gather(*(r.start() for r in started.values()))
        yield started
    finally:
        for replica in started.values():
            if replica.process is not None and replica.process.poll() is None:
                replica.stop(signal.SIGKILL)
