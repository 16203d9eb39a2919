"""A tiny real model package (an ONNX classifier built with onnx's helper API, no torch): what
tests, fuzzers and soak benchmarks serve when the model itself is not under test."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from edgeagent.models.manifest_writer import Manifest, VariantFiles, write_manifest
from edgeagent.models.package import Preprocess, ServingHints, TensorSpec


def write_tiny_onnx(
    path: Path,
    classes: int = 4,
    seed: int = 0,
    size: int = 8,
    *,
    slow_matmuls: int = 0,
    fail_above: float | None = None,
) -> np.ndarray:
    """A global-average-pool + linear classifier over (N, 3, size, size); returns its weights.

    Two deliberately bad versions for canary tests, with the same answers otherwise (their
    extra branch adds 0 to the logits): ``slow_matmuls`` chains that many 1024×1024 MatMuls
    on the input (a slower model), and ``fail_above`` makes the runtime fail whenever an input
    value exceeds it (a Gather index out of range) — golden and sample inputs stay below it.
    """
    import onnx
    from onnx import TensorProto, helper

    weights = np.random.default_rng(seed).standard_normal((3, classes)).astype(np.float32)
    nodes = [
        helper.make_node("GlobalAveragePool", ["input"], ["pooled"]),
        helper.make_node("Flatten", ["pooled"], ["flat"]),
        helper.make_node("MatMul", ["flat", "W"], ["linear"]),
    ]
    initializers = [helper.make_tensor("W", TensorProto.FLOAT, weights.shape, weights.flatten())]
    extras = []  # tensors that are 0 and broadcast onto the logits

    def constant(name: str, value: np.ndarray) -> None:
        kind = TensorProto.INT64 if value.dtype == np.int64 else TensorProto.FLOAT
        initializers.append(helper.make_tensor(name, kind, value.shape, value.flatten()))

    if slow_matmuls:
        constant("spread", np.full((3 * size * size, 1024), 1e-3, np.float32))
        constant("same", np.eye(1024, dtype=np.float32))
        constant("zero", np.zeros((), np.float32))
        nodes += [
            helper.make_node("Flatten", ["input"], ["pixels"]),
            helper.make_node("MatMul", ["pixels", "spread"], ["slow_0"]),
        ]
        for i in range(slow_matmuls):
            nodes.append(helper.make_node("MatMul", [f"slow_{i}", "same"], [f"slow_{i + 1}"]))
        nodes += [
            helper.make_node("ReduceSum", [f"slow_{slow_matmuls}"], ["slow_sum"], keepdims=1),
            helper.make_node("Mul", ["slow_sum", "zero"], ["slow_zero"]),
        ]
        extras.append("slow_zero")
    if fail_above is not None:
        constant("limit", np.array(fail_above, np.float32))
        constant("out_of_range", np.array(1000, np.int64))
        constant("nothing", np.zeros((1,), np.float32))
        nodes += [
            helper.make_node("ReduceMax", ["input"], ["peak"], keepdims=0),
            helper.make_node("Greater", ["peak", "limit"], ["over"]),
            helper.make_node("Cast", ["over"], ["over_i"], to=TensorProto.INT64),
            helper.make_node("Mul", ["over_i", "out_of_range"], ["index"]),
            helper.make_node("Gather", ["nothing", "index"], ["fail_zero"]),
        ]
        extras.append("fail_zero")
    last = "linear"
    for i, extra in enumerate(extras):
        nodes.append(helper.make_node("Add", [last, extra], [f"with_{i}"]))
        last = f"with_{i}"
    nodes.append(helper.make_node("Identity", [last], ["logits"]))
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, size, size])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", classes])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return weights


def tiny_manifest(
    name: str, version: str, classes: int, variants: tuple[VariantFiles, ...]
) -> Manifest:
    """What the tiny package declares, for ``variants`` of its model (8×8 RGB in, logits out)."""
    return Manifest(
        name=name,
        version=version,
        labels="labels.txt",
        inputs=(TensorSpec("input", "float32", (-1, 3, 8, 8), "NCHW"),),
        outputs=(TensorSpec("logits", "float32", (-1, classes)),),
        preprocess=Preprocess(
            size=(8, 8),
            resize=None,
            layout="NCHW",
            color="RGB",
            scale=1.0 / 255.0,
            mean=(0.5, 0.5, 0.5),
            std=(0.25, 0.25, 0.25),
        ),
        serving=ServingHints(max_batch_size=4, max_queue_delay_ms=2.0),
        variants=variants,
    )


def write_tiny_package(
    root: Path,
    name: str = "tiny",
    version: str = "1",
    classes: int = 4,
    seed: int = 0,
    **bad: Any,
) -> Path:
    """A complete, valid model package with one ONNX fp32 variant; returns its directory.
    ``bad`` are write_tiny_onnx's slow / failing options."""
    root.mkdir(parents=True, exist_ok=True)
    model_file = root / f"{name}.fp32.onnx"
    write_tiny_onnx(model_file, classes=classes, seed=seed, **bad)
    (root / "labels.txt").write_text("".join(f"class_{i}\n" for i in range(classes)))
    variant = VariantFiles("onnxruntime", "fp32", (model_file.name,))
    write_manifest(root, tiny_manifest(name, version, classes, (variant,)))
    return root
