"""The data plane's one inference call and the engine's request types, without a transport.

``DataPlane.infer(request, name, version)`` is what every transport calls once per request:
the lookup, the choice of outputs and the options happen inside it. The tensor builders of
``engine/requests.py`` are the one place a wire shape becomes a numpy array, so their hostile
shapes are checked here once for every transport.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgeagent.engine.dataplane import DataPlane
from edgeagent.engine.errors import InvalidInput, ModelNotFound
from edgeagent.engine.requests import (
    MAX_DIMS,
    InferenceRequest,
    check_shape,
    tensor_from_buffer,
    tensor_from_values,
)
from edgeagent.engine.settings import EngineSettings
from edgeagent.models.package import ModelPackage, TensorSpec, load_package
from tests.support.helpers import write_tiny_package


class FakeModel:
    """A loaded model that answers float64 outputs and records the options it was given."""

    def __init__(self, package: ModelPackage) -> None:
        self.package = package
        self.version = package.version
        self.sequences = None  # stateless
        self.calls: list[dict[str, Any]] = []

    async def infer(self, feeds: dict[str, np.ndarray], **options: Any) -> dict[str, np.ndarray]:
        self.calls.append(options)
        rows = next(iter(feeds.values())).shape[0]
        return {spec.name: np.ones((rows, 2), np.float64) for spec in self.package.outputs}


class FakeRegistry:
    """Hands out one model by name and counts the lookups."""

    def __init__(self, model: FakeModel) -> None:
        self.model = model
        self.lookups: list[tuple[str, str | None]] = []

    def get(self, name: str, version: str | None = None) -> FakeModel:
        self.lookups.append((name, version))
        if name != self.model.package.name:
            raise ModelNotFound(f"unknown model {name!r}")
        return self.model


@pytest.fixture
def plane(tmp_path: Path) -> tuple[DataPlane, FakeRegistry]:
    package = load_package(write_tiny_package(tmp_path / "tiny"))
    # Two outputs, so that selection and order can be seen.
    two = TensorSpec("scores", "float32", (-1, 2))
    package = dataclasses.replace(package, outputs=[*package.outputs, two])
    registry = FakeRegistry(FakeModel(package))
    settings = EngineSettings(request_timeout_s=5.0)
    return DataPlane(registry, settings), registry  # type: ignore[arg-type]


def _request(**fields: Any) -> InferenceRequest:
    return InferenceRequest(inputs={"input": np.zeros((1, 3, 8, 8), np.float32)}, **fields)


async def test_one_call_looks_up_once_and_answers_every_output_in_the_advertised_dtype(
    plane: tuple[DataPlane, FakeRegistry],
) -> None:
    dataplane, registry = plane
    answer = await dataplane.infer(_request(id="r1"), "tiny", "1")
    assert registry.lookups == [("tiny", "1")]
    assert (answer.model_name, answer.model_version, answer.id) == ("tiny", "1", "r1")
    assert list(answer.outputs) == ["logits", "scores"]  # the model's order
    assert {array.dtype for array in answer.outputs.values()} == {np.dtype("float32")}


async def test_outputs_are_chosen_in_the_order_asked_and_bad_names_refused_before_running(
    plane: tuple[DataPlane, FakeRegistry],
) -> None:
    dataplane, registry = plane
    answer = await dataplane.infer(_request(outputs=["scores", "logits"]), "tiny")
    assert list(answer.outputs) == ["scores", "logits"]
    for outputs, fragment in (
        (["probs"], "unknown output 'probs' (the model has: logits, scores)"),
        (["logits", "logits"], "output 'logits' is requested twice"),
    ):
        with pytest.raises(InvalidInput, match=fragment.replace("(", r"\(").replace(")", r"\)")):
            await dataplane.infer(_request(outputs=outputs), "tiny")
    assert len(registry.model.calls) == 1  # refused requests never reached the model
    with pytest.raises(ModelNotFound):
        await dataplane.infer(_request(), "ghost")


@pytest.mark.parametrize(
    ("parameters", "deadline_s", "options"),
    [
        ({}, None, {}),
        ({"priority": 0, "timeout": 2_000_000}, None, {"timeout_s": 2.0}),
        ({"priority": 1, "timeout": 60_000_000}, None, {"priority": 1, "timeout_s": 5.0}),
        ({}, 0.5, {"timeout_s": 0.5}),  # a transport's deadline shortens the request's time
        ({}, 3600.0, {"timeout_s": 5.0}),  # ...and never lengthens it past the configured one
        ({"timeout": 100_000}, 2.0, {"timeout_s": 0.1}),
        ({}, -1.0, {"timeout_s": 1e-3}),  # already expired: still a deadline, answered 504
    ],
)
async def test_options_come_from_the_parameters_and_the_transport_deadline(
    plane: tuple[DataPlane, FakeRegistry],
    parameters: dict[str, Any],
    deadline_s: float | None,
    options: dict[str, Any],
) -> None:
    dataplane, registry = plane
    await dataplane.infer(_request(parameters=parameters, deadline_s=deadline_s), "tiny")
    assert registry.model.calls == [options]


@pytest.mark.parametrize(
    ("parameters", "fragment"),
    [
        ({"priority": -1}, "parameters.priority must be a non-negative integer"),
        ({"priority": True}, "parameters.priority must be a non-negative integer"),
        ({"timeout": 0}, r"parameters.timeout must be a positive integer \(µs\)"),
        ({"timeout": "1"}, r"parameters.timeout must be a positive integer \(µs\)"),
    ],
)
async def test_bad_options_are_refused_by_name(
    plane: tuple[DataPlane, FakeRegistry], parameters: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(InvalidInput, match=fragment):
        await plane[0].infer(_request(parameters=parameters), "tiny")


# Shapes from finding 11 of issue 23 and their kin: each once crashed a tensor builder with
# numpy's ValueError (a 500 / INTERNAL) instead of an InvalidInput naming the input.
HOSTILE_SHAPES = [
    ([0, 2**63 - 1], "is larger than any tensor can be"),
    ([1] * 1000, "shape has 1000 dimensions, at most 32"),
    ([1] * (MAX_DIMS + 1), "shape has 33 dimensions, at most 32"),
    ([0, 2**62, 2**62], "is larger than any tensor can be"),
    ([2, -1], "shape must be a list of non-negative integers"),
    ([True, 1], "shape must be a list of non-negative integers"),
    ([1.0], "shape must be a list of non-negative integers"),
    ("11", "shape must be a list of non-negative integers"),
    (None, "shape must be a list of non-negative integers"),
]


@pytest.mark.parametrize(("shape", "fragment"), HOSTILE_SHAPES)
def test_hostile_shapes_are_refused_by_every_builder(shape: Any, fragment: str) -> None:
    with pytest.raises(InvalidInput, match=rf"^input 'x': .*{fragment.split(',')[0]}"):
        check_shape(shape, "input 'x'")
    for build in (tensor_from_buffer, tensor_from_values):
        data: Any = b"" if build is tensor_from_buffer else []
        with pytest.raises(InvalidInput, match=fragment.split(",")[0]):
            build(data, shape, "FP32", "input 'x'")


def test_a_million_dimensions_get_a_short_message() -> None:
    with pytest.raises(InvalidInput) as caught:
        check_shape([-1] * 1_000_000, "input 'x'")
    assert len(caught.value.message) < 100


def test_builders_refuse_what_does_not_fit_and_build_what_does() -> None:
    with pytest.raises(InvalidInput, match="out of range for INT8"):
        tensor_from_values([300], [1], "INT8", "input 'x'")  # was numpy's OverflowError
    with pytest.raises(InvalidInput, match="data must hold INT32 values"):
        tensor_from_values([1.5], [1], "INT32", "input 'x'")
    with pytest.raises(InvalidInput, match="binary_data_size is 3 bytes"):
        tensor_from_buffer(b"abc", [1], "FP32", "input 'x'")
    with pytest.raises(InvalidInput, match="datatype BF16 is not supported"):
        tensor_from_buffer(b"", [0], "BF16", "input 'x'")
    empty = tensor_from_buffer(b"", [0, 2**40], "FP32", "input 'x'")
    assert empty.shape == (0, 2**40)
    big_endian = np.arange(3, dtype=">i2")
    built = tensor_from_buffer(big_endian.astype("<i2").tobytes(), (3,), "INT16", "input 'x'")
    np.testing.assert_array_equal(built, [0, 1, 2])
    np.testing.assert_array_equal(tensor_from_values([[1, 2]], (1, 2), "FP16", "x"), [[1, 2]])


class SilentDetector(FakeModel):
    """A detector's outputs in its own shapes, finding nothing."""

    async def infer(self, feeds: dict[str, np.ndarray], **options: Any) -> dict[str, np.ndarray]:
        self.calls.append(options)
        rows = next(iter(feeds.values())).shape[0]
        return {
            spec.name: np.zeros((rows, *spec.shape[1:]), np.float32)
            for spec in self.package.outputs
        }


async def test_a_camera_frame_goes_at_its_priority_and_deadline_through_the_detector(
    tmp_path: Path,
) -> None:
    from PIL import Image

    from tests.support.helpers import REPO

    registry = FakeRegistry(SilentDetector(load_package(REPO / "zoo" / "coco_ssd")))
    dataplane = DataPlane(registry, EngineSettings(request_timeout_s=5.0))  # type: ignore[arg-type]
    frame = Image.new("RGB", (640, 360))
    package, found = await dataplane.detect_frame(
        "coco_ssd", frame, min_score=0.25, priority=5, timeout_s=1.5
    )
    assert package.name == "coco_ssd" and len(found) == 0
    # A deadline longer than [server] request_timeout_s is cut to it, never lengthened.
    await dataplane.detect_frame("coco_ssd", frame, priority=7, timeout_s=60)
    assert registry.model.calls == [
        {"priority": 5, "timeout_s": 1.5},
        {"priority": 7, "timeout_s": 5.0},
    ]
    tiny = FakeRegistry(FakeModel(load_package(write_tiny_package(tmp_path / "tiny"))))
    with pytest.raises(InvalidInput, match="not a detector"):
        await DataPlane(tiny, EngineSettings()).detect_frame("tiny", frame)  # type: ignore[arg-type]
