"""A YOLO-style toy detector package whose network always answers fixed rows, so every box an
API returns can be checked to the pixel through the letterbox mapping, thresholds and NMS."""

from __future__ import annotations

import io
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from devtools.package import write_model_toml
from edgeagent.models.package import file_sha256
from tests.support.helpers import write_tiny_package
from tests.support.http_agent import AgentServer

# cx, cy, w, h in the 64×64 input; then the scores of "cat" and "dog".
ROWS = np.array(
    [
        [32, 32, 20, 10, 0.9, 0.1],  # cat, x 22..42, y 27..37
        [33, 32, 20, 10, 0.8, 0.1],  # the same cat again, lower: NMS removes it
        [10, 40, 8, 8, 0.1, 0.6],  # dog, x 6..14, y 36..44
        [50, 50, 6, 6, 0.2, 0.1],  # below every threshold
    ],
    np.float32,
)
# A 128×64 image letterboxed into 64×64: scale 0.5, 16 px of padding above and below.
CAT = [44.0, 22.0, 84.0, 42.0]
DOG = [12.0, 40.0, 28.0, 56.0]


def write_toy_detector(root: Path) -> Path:
    """A YOLO-style detector package whose network always answers ``ROWS`` (per image)."""
    import onnx
    from onnx import TensorProto, helper

    root.mkdir(parents=True, exist_ok=True)
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMean", ["input"], ["mean"], keepdims=1),  # [N, 1, 1, 1]
            helper.make_node("Reshape", ["mean", "shape"], ["per_image"]),  # [N, 1, 1]
            helper.make_node("Mul", ["per_image", "zero"], ["nothing"]),
            helper.make_node("Add", ["nothing", "rows"], ["boxes"]),  # [N, 4, 6]
        ],
        "toy_detector",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 64, 64])],
        [helper.make_tensor_value_info("boxes", TensorProto.FLOAT, ["N", 4, 6])],
        [
            helper.make_tensor("shape", TensorProto.INT64, [3], [-1, 1, 1]),
            helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]),
            helper.make_tensor("rows", TensorProto.FLOAT, [1, 4, 6], ROWS.ravel()),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(root / "toy.fp32.onnx"))
    (root / "labels.txt").write_text("cat\ndog\n")
    write_model_toml(
        root,
        {
            "name": "toy",
            "version": "1",
            "task": "detection",
            "labels": "labels.txt",
            "inputs": [{"name": "input", "dtype": "float32", "shape": [-1, 3, 64, 64]}],
            "outputs": [{"name": "boxes", "dtype": "float32", "shape": [-1, 4, 6]}],
            "preprocess": {"size": [64, 64], "letterbox": True},
            "detection": {"style": "yolo", "score_threshold": 0.3, "iou_threshold": 0.5},
            "variant": [
                {
                    "runtime": "onnxruntime",
                    "precision": "fp32",
                    "files": ["toy.fp32.onnx"],
                    "sha256": {"toy.fp32.onnx": file_sha256(root / "toy.fp32.onnx")},
                }
            ],
        },
    )
    return root


def image_bytes(kind: str = "PNG", size: tuple[int, int] = (128, 64)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, (30, 90, 150)).save(buffer, format=kind)
    return buffer.getvalue()


@contextmanager
def detector_agent(root: Path, **settings: Any) -> Iterator[AgentServer]:
    """An agent serving the toy detector (DeepStack's model unless ``settings`` say otherwise)
    and the tiny classifier, stopped on exit."""
    packages = [write_toy_detector(root / "toy"), write_tiny_package(root / "tiny")]
    server = AgentServer(root, packages, **{"deepstack_model": "toy", **settings}).start()
    try:
        yield server
    finally:
        server.stop()
