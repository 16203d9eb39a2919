"""The engine's typed seams: load totals for the governor, feeds merged and split, backends
reported through the ManagedSession protocol, golden and sample feeds written once."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from edgeagent.engine.batcher import backend_of
from edgeagent.engine.busy_counter import LoadCounter
from edgeagent.engine.feeds import concat_feeds, split_outputs
from edgeagent.governor.service import GovernorService
from edgeagent.governor.settings import GovernorSettings
from edgeagent.hardware.profile import Candidate, load_profiles
from edgeagent.models.golden import GoldenError, load_golden, sample_feeds
from edgeagent.models.package import load_package
from edgeagent.models.session import open_variant
from edgeagent.runtimes.base import ManagedSession
from tests.support.helpers import write_tiny_package


@pytest.fixture
def executor():
    with ThreadPoolExecutor(2) as pool:
        yield pool


@pytest.fixture
def package(tmp_path: Path):
    return load_package(write_tiny_package(tmp_path / "tiny"))


async def test_governor_reads_the_engines_load_counter() -> None:
    counter = LoadCounter()
    generic = next(p for p in load_profiles() if p.generic)
    settings = GovernorSettings(simulate=True)
    governor = GovernorService(settings, generic, Path("/"), CollectorRegistry(), load=counter)
    counter.record_batch(0.5)  # the governor sees exactly what the engine counted
    counter.record_batch(0.3)
    await governor.tick()
    assert governor.engine_load.batch_seconds == pytest.approx(0.4)
    await governor.stop()


def test_concat_and_split_keep_each_requests_rows(package) -> None:
    a, b = np.zeros((1, 3, 8, 8), np.float32), np.ones((2, 3, 8, 8), np.float32)
    batch = concat_feeds(package.inputs, [{"input": a}, {"input": b}])
    assert batch["input"].shape == (3, 3, 8, 8)
    first, second = split_outputs({"logits": batch["input"][:, 0, 0, :4]}, [1, 2])
    assert first["logits"].shape == (1, 4) and second["logits"].shape == (2, 4)
    np.testing.assert_array_equal(second["logits"], 1.0)
    with pytest.raises(RuntimeError, match="cannot be split"):
        split_outputs({"logits": np.zeros((2, 4))}, [1, 2])


class Managed:
    """A Session with the ManagedSession extensions: its candidate is what reports."""

    runtime, device, precision = "resilient", "?", "?"
    candidate = Candidate("openvino", "NPU", "int8")

    def set_power_mode(self, mode: str) -> None: ...

    def status(self) -> dict:
        return {}


def test_backend_of_reads_a_managed_sessions_candidate(package) -> None:
    assert isinstance(Managed(), ManagedSession)
    assert backend_of(Managed()) == ("openvino", "NPU", "int8")  # type: ignore[arg-type]
    plain = open_variant(package)
    assert not isinstance(plain, ManagedSession)
    assert backend_of(plain)[0] == "onnxruntime"


def test_sample_feeds_are_fixed_varied_and_not_zero(package) -> None:
    one, two = sample_feeds(package), sample_feeds(package)
    assert one["input"].shape == (1, 3, 8, 8) and one["input"].dtype == np.float32
    np.testing.assert_array_equal(one["input"], two["input"])
    assert np.any(one["input"] != 0)  # some delegates special-case all-zero input
    values = one["input"].ravel()
    assert np.abs(values).max() <= 2 and values.std() > 0.5 and len(np.unique(values)) > 100


def test_golden_set_is_read_once_with_clear_errors(tmp_path: Path, package) -> None:
    assert load_golden(package) is None  # no golden file: callers use the sample feeds
    path = tmp_path / "golden.npz"
    np.savez(path, inputs=np.ones((2, 3, 8, 8)), top1=np.array([[1], [3]]))
    golden = load_golden(replace(package, golden=path))
    assert golden is not None and golden.feeds["input"].dtype == np.float32
    assert golden.top1.tolist() == [1, 3]
    np.savez(path, inputs=np.ones((2, 3, 8, 8)))
    with pytest.raises(GoldenError, match="lacks top1"):
        load_golden(replace(package, golden=path))
