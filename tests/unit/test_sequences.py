"""Per-sequence state: the request parameters, the [sequence] table, name pairing, eviction.

The store is driven with an injected clock (eviction after ``sequence_idle_timeout_s`` without
waiting for it) and a real onnxruntime session of a leaky-sum graph as the model's shared path.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from edgeagent.engine.errors import InvalidInput, QueueFull
from edgeagent.engine.sequences import SequenceControl, SequenceStore, sequence_control
from edgeagent.models.package import PackageError
from edgeagent.models.sequence_table import SequenceSpec, read_sequence
from edgeagent.models.tensor_tables import TensorSpec
from edgeagent.packaging.sources import NativeTensor
from edgeagent.packaging.stateful import state_pairs
from tests.support.stateful import leaky_onnx, leaky_reference

INPUTS = (TensorSpec("x", "float32", (-1, 4)), TensorSpec("state_in", "float32", (-1, 4)))
OUTPUTS = (TensorSpec("y", "float32", (-1, 4)), TensorSpec("state_out", "float32", (-1, 4)))


@pytest.mark.parametrize(
    ("parameters", "expected"),
    [
        ({}, None),
        ({"sequence_id": 0}, None),  # Triton's "no sequence"
        ({"sequence_id": 7, "sequence_start": True}, SequenceControl(7, True, False)),
        ({"sequence_id": "cam-1", "sequence_end": True}, SequenceControl("cam-1", False, True)),
    ],
)
def test_sequence_parameters(parameters: dict, expected: SequenceControl | None) -> None:
    assert sequence_control(parameters) == expected


@pytest.mark.parametrize(
    "parameters",
    [
        {"sequence_id": True},
        {"sequence_id": -3},
        {"sequence_id": ""},
        {"sequence_id": "x" * 129},
        {"sequence_id": 2.5},
        {"sequence_id": 1, "sequence_start": "yes"},
        {"sequence_start": True},
    ],
)
def test_bad_sequence_parameters_are_refused(parameters: dict) -> None:
    with pytest.raises(InvalidInput, match="parameters.sequence"):
        sequence_control(parameters)


def test_state_inputs_pair_with_their_outputs_by_name_only() -> None:
    def tensors(*names: str, shape: tuple = (1, 4)) -> tuple[NativeTensor, ...]:
        return tuple(NativeTensor(n, "float32", shape) for n in names)

    assert state_pairs(tensors("x", "state_in"), tensors("y", "state_out")) == (
        ("state_in", "state_out"),
    )
    assert state_pairs(tensors("input", "state", "h0"), tensors("output", "stateN", "hn")) == (
        ("state", "stateN"),
        ("h0", "hn"),
    )
    # Same shapes, unrelated names: an image in and an image out is no state.
    assert state_pairs(tensors("image"), tensors("mask")) == ()
    # A dtype or rank that differs is not the same state either.
    odd = (NativeTensor("state_out", "float32", (4,)),)
    assert state_pairs(tensors("x", "state_in"), odd) == ()


def test_the_sequence_table_is_checked_against_the_tensors(tmp_path: Path) -> None:
    manifest = tmp_path / "model.toml"
    table = SequenceSpec("tensors", (("state_in", "state_out"),)).table()
    assert read_sequence(manifest, table, INPUTS, OUTPUTS) == SequenceSpec(
        "tensors", (("state_in", "state_out"),)
    )
    bad = {"state": "tensors", "pairs": [{"input": "state_in", "output": "nope"}]}
    with pytest.raises(PackageError, match=r"sequence.pairs\[0\].output: 'nope'"):
        read_sequence(manifest, bad, INPUTS, OUTPUTS)
    with pytest.raises(PackageError, match="needs at least one"):
        read_sequence(manifest, {"state": "tensors"}, INPUTS, OUTPUTS)
    with pytest.raises(PackageError, match="is not one of"):
        read_sequence(manifest, {"state": "weights"}, INPUTS, OUTPUTS)


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def leaky(tmp_path_factory: pytest.TempPathFactory) -> ort.InferenceSession:
    path = leaky_onnx(tmp_path_factory.mktemp("leaky") / "leaky.onnx")
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def _store(clock: _Clock, limit: int = 2) -> SequenceStore:
    from edgeagent.models.package import ModelPackage, Postprocess

    package = ModelPackage(
        root=Path("."), name="leaky", version="1", task="tensor", description="",
        inputs=INPUTS, outputs=OUTPUTS, preprocess=None, postprocess=Postprocess(False, 1),
        labels=(), variants=(),
    )  # fmt: skip
    spec = SequenceSpec("tensors", (("state_in", "state_out"),))
    return SequenceStore(package, spec, max_sequences=limit, idle_timeout_s=30, clock=clock)


async def test_idle_sequences_are_evicted_and_the_bound_holds(
    leaky: ort.InferenceSession,
) -> None:
    clock = _Clock()
    store = _store(clock)

    async def run(feeds):  # the model's shared path: the real graph
        y, state = leaky.run(None, dict(feeds))
        return {"y": y, "state_out": state}

    async def step(sequence: int, start: bool = False) -> float:
        feeds = {"x": np.ones((1, 4), np.float32)}
        answer = await store.infer(SequenceControl(sequence, start), feeds, run)
        return float(answer["y"][0, 0])

    assert await step(1, start=True) == 2.0
    assert await step(2, start=True) == 2.0
    with pytest.raises(QueueFull, match="max_sequences = 2"):
        await step(3, start=True)
    clock.now = 20.0
    assert await step(1) == 3.0  # sequence 1 used again: not idle
    clock.now = 40.0  # sequence 2 idle for 40 s > 30 s: evicted by the next request
    assert await step(3, start=True) == 2.0
    assert store.evicted == 1 and store.live == 2
    with pytest.raises(InvalidInput, match="not live"):
        await step(2)
    want = leaky_reference(np.ones((3, 4), np.float32))[-1, 0]
    assert await step(1) == pytest.approx(want)  # its state survived the others' churn
    await store.close()
    assert store.live == 0
