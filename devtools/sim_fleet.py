"""The fleet simulator's parent side: N devices split over worker processes (``sim_worker``).

``SimFleet.plan`` names the devices ``sim-00000``… (zero-padded, so the hub's sorted device
list — and so every rollout stage — follows their index), spreads them over two profiles and
picks which fail a given version: device i fails when ``(7 * i) % 100 < fail_pct``, which is
exactly ``fail_pct`` % of any 100 consecutive devices, so stage 1 of a rollout (its first
devices) has the share asked for.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import Sequence
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from devtools.sim_device import DevicePlan
from devtools.sim_worker import WorkerPlan, worker_main
from edgeagent.fleet.settings import MqttSettings

PROFILES = ("generic-x86_64", "generic-aarch64")


def fails(index: int, fail_pct: float) -> bool:
    return (7 * index) % 100 < fail_pct


def plan_devices(
    count: int, group: str, *, fail_version: str = "", fail_pct: float = 0.0
) -> list[DevicePlan]:
    return [
        DevicePlan(
            f"sim-{i:05d}",
            group,
            PROFILES[i % len(PROFILES)],
            (fail_version,) if fail_version and fails(i, fail_pct) else (),
        )
        for i in range(count)
    ]


class SimFleet:
    """Worker processes, each holding a contiguous share of the devices."""

    def __init__(
        self,
        devices: Sequence[DevicePlan],
        workers: int,
        *,
        mqtt: MqttSettings,
        trust_file: Path,
        state_root: Path,
    ) -> None:
        self.count = len(devices)
        share = -(-len(devices) // workers)
        self.plans = [
            WorkerPlan(tuple(devices[i : i + share]), mqtt, trust_file, state_root)
            for i in range(0, len(devices), share)
        ]
        self._pipes: list[Connection] = []
        self._processes: list[BaseProcess] = []

    async def start(self) -> list[dict[str, Any]]:
        """Spawn the workers; returns what each said once it had built its devices."""
        context = multiprocessing.get_context("spawn")  # no inherited event loop or sockets
        for plan in self.plans:
            parent, child = context.Pipe()
            process = context.Process(target=worker_main, args=(child, plan), daemon=True)
            process.start()
            child.close()
            self._pipes.append(parent)
            self._processes.append(process)
        return await asyncio.gather(*(asyncio.to_thread(p.recv) for p in self._pipes))

    async def call(self, *command: Any) -> list[dict[str, Any]]:
        """Send ``command`` to every worker at once; their answers, in worker order."""
        for pipe in self._pipes:
            pipe.send(command)
        answers = await asyncio.gather(*(asyncio.to_thread(p.recv) for p in self._pipes))
        errors = [a["error"] for a in answers if "error" in a]
        if errors:
            raise RuntimeError(f"simulator worker failed on {command[0]}: {errors[0]}")
        return answers

    async def stop(self) -> None:
        if self._pipes:
            try:
                await self.call("stop")
            except (OSError, EOFError):  # a worker died already: nothing left to stop there
                pass
            finally:
                for process in self._processes:
                    await asyncio.to_thread(process.join, 30)
                    if process.is_alive():
                        process.kill()
                self._pipes.clear()
                self._processes.clear()
