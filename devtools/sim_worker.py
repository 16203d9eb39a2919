"""A worker process of the fleet simulator: a share of the devices on one event loop.

One process holds a few thousand ``SimDevice``s (one event loop, one interpreter, one copy of
the libraries: what can be shared is shared), each with its own MQTT session, state directory
and update client. The parent drives it over a ``multiprocessing`` pipe with small commands
and gets plain dicts back, so any number of workers run in parallel on the machine's cores:

    ("connect",)                       → start every device, wait until each is connected
    ("await", model, version, wait_s)  → wait until every device ended an install of version
    ("stop",)                          → stop every device (they say "offline"), then exit
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import resource
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import psutil

from devtools.sim_device import DevicePlan, SimDevice
from edgeagent.fleet.settings import MqttSettings
from edgeagent.hardware.profile import load_profiles

STOP_WAIT_S = 30.0
CONNECT_CHUNK = 250  # sessions opened at once: a bounded burst for the broker and the loop


@dataclass(frozen=True)
class WorkerPlan:
    devices: tuple[DevicePlan, ...]
    mqtt: MqttSettings
    trust_file: Path
    state_root: Path


def raise_open_files_limit() -> int:
    """Lift the soft descriptor limit to the hard one (a device holds a socket and files)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


class Worker:
    def __init__(self, plan: WorkerPlan) -> None:
        profiles = {p.name: p for p in load_profiles()}
        self.plan = plan
        self.process = psutil.Process()
        self.baseline_rss = self.process.memory_info().rss
        self.devices = [
            SimDevice(
                d,
                profiles[d.profile],
                plan.mqtt,
                plan.trust_file,
                plan.state_root / d.device_id,
            )
            for d in plan.devices
        ]
        self.ended = asyncio.Event()  # set whenever a device ended an install
        for device in self.devices:
            device.on_end = self.ended.set

    def _usage(self) -> dict[str, Any]:
        cpu = self.process.cpu_times()
        return {
            "pid": os.getpid(),
            "rss_bytes": self.process.memory_info().rss,
            "baseline_rss_bytes": self.baseline_rss,
            "cpu_s": cpu.user + cpu.system,
        }

    async def connect(self) -> dict[str, Any]:
        start = time.perf_counter()
        for first in range(0, len(self.devices), CONNECT_CHUNK):
            chunk = self.devices[first : first + CONNECT_CHUNK]
            for device in chunk:
                await device.start()
            await asyncio.gather(*(d.service.link.connected.wait() for d in chunk))
        return {"devices": len(self.devices), "seconds": time.perf_counter() - start}

    async def await_version(self, model: str, version: str, wait_s: float) -> dict[str, Any]:
        """Every device's end of an install of ``version``: when it was verified, when it
        ended, and how (``results``); ``missing`` devices had not ended within ``wait_s``."""
        deadline = time.monotonic() + wait_s
        while (left := deadline - time.monotonic()) > 0:
            if all(version in d.ended for d in self.devices):
                break
            self.ended.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.ended.wait(), left)
        ended = [d.ended[version] for d in self.devices if version in d.ended]
        verified = [d.verified[version] for d in self.devices if version in d.verified]
        serving = collections.Counter(str(d.serving(model)) for d in self.devices)
        arrivals = [d.received_at for d in self.devices if d.received_at is not None]
        return {
            "last_received": max(arrivals, default=None),
            "verified": len(verified),
            "first_verified": min(verified, default=None),
            "last_verified": max(verified, default=None),
            "last_ended": max((at for at, _ in ended), default=None),
            "results": dict(collections.Counter(result for _, result in ended)),
            "missing": len(self.devices) - len(ended),
            "serving": dict(serving),
            # how many devices got the hub's envelopes how many times ({1: N}: exactly once)
            "direct_releases": dict(collections.Counter(d.direct_releases for d in self.devices)),
        }

    async def stop(self) -> dict[str, Any]:
        """Stop every device, but give up after ``STOP_WAIT_S``: the process exit that follows
        closes whatever is left (the broker then sends their Last Will)."""
        stops = [asyncio.create_task(d.stop()) for d in self.devices]
        done, _ = await asyncio.wait(stops, timeout=STOP_WAIT_S)
        return {"stopped": len(done), "abandoned": len(stops) - len(done)}

    async def handle(self, command: tuple[Any, ...]) -> dict[str, Any]:
        name, *args = command
        cpu_before = self._usage()["cpu_s"]
        if name == "connect":
            answer = await self.connect()
        elif name == "await":
            answer = await self.await_version(*args)
        elif name == "stop":
            answer = await self.stop()
        else:
            raise ValueError(f"unknown command {name!r}")
        usage = self._usage()
        return {**answer, **usage, "command_cpu_s": usage["cpu_s"] - cpu_before}


async def _serve(conn: Connection, plan: WorkerPlan) -> None:
    worker = Worker(plan)
    loop = asyncio.get_running_loop()
    conn.send({"ready": len(worker.devices), "open_files_limit": raise_open_files_limit()})
    while True:
        command = await loop.run_in_executor(None, conn.recv)
        try:
            answer = await worker.handle(command)
        except Exception as exc:  # the parent reports it; the worker stays for "stop"
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        conn.send(answer)
        if command[0] == "stop":
            if answer.get("abandoned"):  # asyncio.run would wait for them again: leave now
                os._exit(0)
            return


def worker_main(conn: Connection, plan: WorkerPlan) -> None:
    """The process entry point (``multiprocessing`` spawns it with ``plan``)."""
    logging.basicConfig(level=logging.ERROR)  # failures are counted, not printed per device
    raise_open_files_limit()
    asyncio.run(_serve(conn, plan))
