"""A tiny real model package (an ONNX classifier built with onnx's helper API, no torch): what
tests, fuzzers and soak benchmarks serve when the model itself is not under test."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np


def write_tiny_onnx(path: Path, classes: int = 4, seed: int = 0, size: int = 8) -> np.ndarray:
    """A global-average-pool + linear classifier over (N, 3, size, size); returns its weights."""
    import onnx
    from onnx import TensorProto, helper

    weights = np.random.default_rng(seed).standard_normal((3, classes)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("GlobalAveragePool", ["input"], ["pooled"]),
            helper.make_node("Flatten", ["pooled"], ["flat"]),
            helper.make_node("MatMul", ["flat", "W"], ["logits"]),
        ],
        "tiny",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, size, size])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", classes])],
        [helper.make_tensor("W", TensorProto.FLOAT, weights.shape, weights.flatten())],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return weights


def write_tiny_package(
    root: Path, name: str = "tiny", version: str = "1", classes: int = 4, seed: int = 0
) -> Path:
    """A complete, valid model package with one ONNX fp32 variant; returns its directory."""
    root.mkdir(parents=True, exist_ok=True)
    model_file = root / f"{name}.fp32.onnx"
    write_tiny_onnx(model_file, classes=classes, seed=seed)
    (root / "labels.txt").write_text("".join(f"class_{i}\n" for i in range(classes)))
    digest = hashlib.sha256(model_file.read_bytes()).hexdigest()
    (root / "model.toml").write_text(
        f"""name = "{name}"
version = "{version}"
task = "classification"
labels = "labels.txt"

[[inputs]]
name = "input"
dtype = "float32"
shape = [-1, 3, 8, 8]
layout = "NCHW"

[[outputs]]
name = "logits"
dtype = "float32"
shape = [-1, {classes}]

[preprocess]
size = [8, 8]
mean = [0.5, 0.5, 0.5]
std = [0.25, 0.25, 0.25]

[serving]
max_batch_size = 4
max_queue_delay_ms = 2

[[variant]]
runtime = "onnxruntime"
precision = "fp32"
files = ["{model_file.name}"]
sha256 = {{ "{model_file.name}" = "{digest}" }}
"""
    )
    return root
