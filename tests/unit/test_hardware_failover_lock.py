"""A failover loads its successor outside the session's lock: nothing else waits for the load.

The successor's load is held on an Event, so the test sees the session *during* a failover:
status and a concurrent request must come back then (the request failing fast with a reason),
not once the load ends. Before the fix both waited on the lock the failing request held.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

from edgeagent.hardware.choose import Option
from edgeagent.hardware.fallback import ResilientSession
from edgeagent.hardware.probe import ProbeResult
from edgeagent.hardware.profile import Candidate
from edgeagent.hardware.settings import HardwareSettings
from edgeagent.models.package import ModelPackage, load_package
from edgeagent.runtimes import InferenceError, Session, TensorInfo
from tests.support.helpers import write_tiny_package

BOUND_S = 10.0  # only ever reached when the code under test blocks


class FakeSession(Session):
    """Answers with the package's output, or fails like a device that went away."""

    def __init__(self, package: ModelPackage, device: str, *, broken: bool = False) -> None:
        self.runtime, self.device, self.precision = "fake", device, "fp32"
        self.broken = broken
        self._inputs = [TensorInfo(t.name, t.dtype, t.shape) for t in package.inputs]
        self._outputs = [TensorInfo(t.name, t.dtype, t.shape) for t in package.outputs]

    @property
    def inputs(self):
        return self._inputs

    @property
    def outputs(self):
        return self._outputs

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        if self.broken:
            raise InferenceError(f"{self.device}: device is gone")
        rows = next(iter(feeds.values())).shape[0]
        return {"logits": np.zeros((rows, 4), np.float32)}


class HeldProber:
    """A Prober whose load waits until the test releases it."""

    def __init__(self, package: ModelPackage) -> None:
        self.package = package
        self.loading = threading.Event()
        self.release = threading.Event()

    def load(self, package, candidate, variant, *, model_hash, use_cache):
        self.loading.set()
        assert self.release.wait(BOUND_S), "the test never released the load"
        return FakeSession(package, candidate.device), ProbeResult(candidate.key, ok=True)


@pytest.fixture
def package(tmp_path: Path) -> ModelPackage:
    return load_package(write_tiny_package(tmp_path / "tiny"))


def _option(package: ModelPackage, rank: int, device: str) -> Option:
    return Option(rank, Candidate("fake", device, "fp32"), package.variants[0])


def test_failover_load_does_not_hold_the_lock(package: ModelPackage) -> None:
    first, second = _option(package, 0, "first"), _option(package, 1, "second")
    prober = HeldProber(package)
    session = ResilientSession(
        package,
        [first, second],
        prober,  # type: ignore[arg-type]
        HardwareSettings(failure_threshold=1),
        model_hash="test",
        initial=(first, FakeSession(package, "first", broken=True)),
    )
    feeds = {"input": np.ones((1, 3, 8, 8), np.float32)}
    failing: dict[str, object] = {}

    def failing_request() -> None:
        failing["answer"] = session.run(feeds)  # fails on "first", retried on "second"

    during: dict[str, object] = {}
    answered = threading.Event()

    def concurrent_request() -> None:
        during["status"] = session.status()
        try:
            session.run(feeds)
        except InferenceError as exc:
            during["error"] = str(exc)
        answered.set()

    failover = threading.Thread(target=failing_request)
    failover.start()
    try:
        assert prober.loading.wait(BOUND_S)  # the successor's load is now in progress
        threading.Thread(target=concurrent_request, daemon=True).start()
        came_back = answered.wait(BOUND_S)
    finally:
        prober.release.set()
        failover.join(BOUND_S)
        now_on = session.candidate
        session.close()
    assert came_back, "status and a request waited for the failover's load"
    assert "switching accelerators" in str(during["error"])
    states = {c["candidate"]: c["state"] for c in during["status"]["candidates"]}  # type: ignore[index]
    assert states["fake:first:fp32"] == "demoted"
    assert failing["answer"]["logits"].shape == (1, 4)  # type: ignore[index]
    assert now_on is not None and now_on.device == "second"
