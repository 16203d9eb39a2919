"""A simulated accelerator: devices SIM0, SIM1 … of known speed behind the real plugin contract.

Tests and benchmarks of one model on several devices need devices whose speed is known, so
that a share of batches or a throughput ratio can be checked against arithmetic rather than
against whatever the CI machine's cores did that second. A session on a simulated device
computes the model's real outputs (onnxruntime on the CPU, one intra-op thread) and then waits
out the rest of its device's service time in ``time.sleep`` — off the GIL, as a host thread
waiting for a device does. A device runs one batch at a time, however many sessions it holds
(a device has one queue). A device can be unplugged (``unplug``: runs raise InferenceError and
loads RuntimeLoadError, the way a lost device fails) and plugged back (``plug``).

It is the onnxruntime plugin with extra devices: every other device (the CPU) goes to the real
plugin. Nothing in the product loads it: a test installs it with ``install_simulated``, a
benchmark with ``SimulatedRuntime.install``; profiles name its devices as candidates
(``onnxruntime:SIM0:fp32``).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from edgeagent import runtimes
from edgeagent.runtimes.base import InferenceError, LoadRequest, RuntimeLoadError
from edgeagent.runtimes.onnx import CPU, OnnxRuntime, OnnxSession

if TYPE_CHECKING:
    import pytest

PREFIX = "SIM"


@dataclasses.dataclass
class SimDevice:
    """One simulated device: its service time and what it ran."""

    name: str
    service_s: float  # per batch, whatever its rows (an accelerator's fixed cost)
    per_row_s: float = 0.0  # on top, per row
    present: bool = True
    batches: int = 0
    rows: int = 0
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, repr=False)

    def service(self, rows: int) -> float:
        return self.service_s + self.per_row_s * rows


class SimulatedSession(OnnxSession):
    """A real onnxruntime CPU session that takes its device's time and fails with it."""

    def __init__(self, session: OnnxSession, request: LoadRequest, device: SimDevice) -> None:
        super().__init__(session._session, request)
        self.device = device.name
        self.sim = device

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        sim = self.sim
        rows = len(next(iter(feeds.values())))
        with sim.lock:  # the device computes one batch at a time
            if not sim.present:
                raise InferenceError(f"onnxruntime ({sim.name}): the device is gone")
            began = time.perf_counter()
            outputs = super().run(feeds)
            remaining = sim.service(rows) - (time.perf_counter() - began)
            if remaining > 0:
                time.sleep(remaining)  # the host thread waiting for the device
            sim.batches += 1
            sim.rows += rows
        return outputs


class SimulatedRuntime(OnnxRuntime):
    """onnxruntime with simulated devices (``{"SIM0": 0.01, "SIM1": 0.02}``: seconds a batch)."""

    def __init__(self, devices: Mapping[str, float]) -> None:
        for name in devices:
            if not name.startswith(PREFIX):
                raise ValueError(f"simulated device names start with {PREFIX}: {name!r}")
        self.sim = {name: SimDevice(name, seconds) for name, seconds in devices.items()}

    def devices(self) -> list[str]:
        return [*super().devices(), *self.sim]

    def load(self, request: LoadRequest) -> OnnxSession:
        if not request.device.startswith(PREFIX):
            return super().load(request)
        device = self.sim.get(request.device)
        if device is None:
            raise RuntimeLoadError(f"no simulated device {request.device} (have: {list(self.sim)})")
        if not device.present:
            raise RuntimeLoadError(f"onnxruntime: simulated device {device.name} is not present")
        cpu = dataclasses.replace(request, device=CPU, threads=1)
        return SimulatedSession(super().load(cpu), request, device)

    def unplug(self, name: str) -> None:
        self.sim[name].present = False

    def plug(self, name: str) -> None:
        self.sim[name].present = True

    def install(self) -> SimulatedRuntime:
        """Serve as "onnxruntime" in this process (a benchmark; tests use install_simulated)."""
        runtimes._loaded["onnxruntime"] = self
        return self


def install_simulated(
    monkeypatch: pytest.MonkeyPatch, devices: Mapping[str, float]
) -> SimulatedRuntime:
    """Install simulated devices as part of the "onnxruntime" plugin for one test."""
    plugin = SimulatedRuntime(devices)
    monkeypatch.setitem(runtimes._loaded, "onnxruntime", plugin)
    return plugin
