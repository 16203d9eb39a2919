"""Small real artefacts for tests: a tiny ONNX classifier and a model package around it.

Built with the ``onnx`` helper API (no torch), so unit tests run in seconds; the zoo's real
networks are exercised by the integration tests.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from concurrent.futures import Executor
from pathlib import Path

import numpy as np
from prometheus_client import CollectorRegistry

from edgeagent.engine.gauges import ModelGauges
from edgeagent.engine.limits import UNTHROTTLED, ServingLimits
from edgeagent.engine.load import LoadCounter
from edgeagent.engine.metrics import EngineMetrics
from edgeagent.engine.registry import ModelRegistry
from edgeagent.engine.serving import ModelFactory
from edgeagent.engine.settings import EngineSettings
from edgeagent.models.package import ModelPackage
from edgeagent.runtimes import Session

REPO = Path(__file__).resolve().parents[1]


def zoo_dir() -> Path:
    """Where scripts/build_models.py put the zoo (EDGEAGENT_ZOO overrides)."""
    return Path(os.environ.get("EDGEAGENT_ZOO", REPO / "zoo"))


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


def serving_registry(
    opener: Callable[[ModelPackage], Session],
    *,
    executor: Executor,
    settings: EngineSettings | None = None,
    metrics: EngineMetrics | None = None,
    limits: Callable[[], ServingLimits] = lambda: UNTHROTTLED,
    load: LoadCounter | None = None,
) -> ModelRegistry:
    """A ModelRegistry wired as the daemon wires it: ModelFactory plus the gauge hooks."""
    settings = settings or EngineSettings()
    metrics = metrics or EngineMetrics(CollectorRegistry())
    factory = ModelFactory(
        settings,
        executor=executor,
        metrics=metrics,
        load=load or LoadCounter(),
        limits_provider=limits,
    )
    gauges = ModelGauges(metrics)
    return ModelRegistry(
        opener,
        factory.build,
        settings=settings,
        executor=executor,
        on_model_load=[gauges.on_load],
        on_model_unload=[gauges.on_unload],
    )
