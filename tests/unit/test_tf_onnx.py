"""What tf2onnx wrote, made packageable (packaging.tf_onnx), on a graph shaped like its output.

The graph is built with onnx's helper as tf2onnx leaves a TF Object Detection API export:
``name:0`` tensors, a uint8 NHWC input of open size, the four outputs in the graph's own order
(boxes, scores, classes, count) with unknown shapes. No TensorFlow is needed here; the real
conversion is tests/integration/test_package_tensorflow.py.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from edgeagent.packaging.errors import PackagingError
from edgeagent.packaging.options import PackageOptions
from edgeagent.packaging.sources import read_source
from edgeagent.packaging.tensorflow_export import (
    GraphFacts,
    _outputs,
    export_tensorflow,
    is_tensorflow_source,
    tensorflow_python,
)
from edgeagent.packaging.tf_onnx import RAW_PIXELS_KEY, finish, raw_pixel_options


def tf2onnx_like(path: Path) -> Path:
    """boxes = mean pixel / 255 in every coordinate; scores, classes and count constants."""
    image = helper.make_tensor_value_info(
        "image_tensor:0", TensorProto.UINT8, [None, None, None, 3]
    )
    outputs = [
        helper.make_tensor_value_info(name, TensorProto.FLOAT, None)
        for name in ("detection_boxes:0", "detection_scores:0", "detection_classes:0")
    ] + [helper.make_tensor_value_info("num_detections:0", TensorProto.FLOAT, None)]
    constants = {
        "k_scale": np.array(1 / 255, np.float32),
        "k_shape": np.array([-1, 1, 1], np.int64),
        "k_tile": np.array([1, 2, 4], np.int64),
        "k_scores": np.array([[0.9, 0.1]], np.float32),
        "k_classes": np.array([[1.0, 3.0]], np.float32),
        "k_count": np.array([1.0], np.float32),
    }
    nodes = [
        helper.make_node("Cast", ["image_tensor:0"], ["pixels"], to=TensorProto.FLOAT),
        helper.make_node("ReduceMean", ["pixels"], ["mean"], keepdims=0, axes=[1, 2, 3]),
        helper.make_node("Mul", ["mean", "k_scale"], ["unit"]),
        helper.make_node("Reshape", ["unit", "k_shape"], ["cell"]),
        helper.make_node("Tile", ["cell", "k_tile"], ["detection_boxes:0"]),
        helper.make_node("Identity", ["k_scores"], ["detection_scores:0"]),
        helper.make_node("Identity", ["k_classes"], ["detection_classes:0"]),
        helper.make_node("Identity", ["k_count"], ["num_detections:0"]),
    ]
    graph = helper.make_graph(
        nodes,
        "tf2onnx_like",
        [image],
        outputs,
        [numpy_helper.from_array(v, k) for k, v in constants.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(path))
    return path


def test_finish_renames_reorders_declares_and_feeds_float_pixels(tmp_path: Path) -> None:
    lines: list[str] = []
    out = finish(tf2onnx_like(tmp_path / "raw.onnx"), tmp_path / "m.onnx", (6, 8), lines.append)
    source = read_source(out)
    assert [(t.name, t.dtype, t.shape) for t in source.inputs] == [
        ("image_tensor", "float32", (None, 6, 8, 3))
    ]
    assert [(t.name, t.shape) for t in source.outputs] == [
        ("detection_boxes", (None, None, 4)),
        ("detection_classes", (None, None)),
        ("detection_scores", (None, None)),
        ("num_detections", (None,)),
    ]
    onnx.checker.check_model(onnx.load(str(out)), full_check=True)
    meta = {p.key: p.value for p in onnx.load(str(out)).metadata_props}
    assert meta[RAW_PIXELS_KEY] == "image_tensor"
    assert any("cast in the graph" in line for line in lines)
    # 0..255 floats are what the graph's uint8 would have been: rounded, clipped
    pixels = np.full((2, 6, 8, 3), 127.6, np.float32)
    pixels[1] = 300.0  # clipped to 255, never wrapped to 44
    boxes, classes, scores, count = ort.InferenceSession(str(out)).run(
        None, {"image_tensor": pixels}
    )
    np.testing.assert_allclose(boxes[:, 0, 0], [128 / 255, 1.0], rtol=1e-6)
    assert classes.tolist() == [[1.0, 3.0]] and scores.tolist()[0] == pytest.approx([0.9, 0.1])
    assert count.tolist() == [1.0]


def test_raw_pixels_set_scale_one_and_refuse_a_mean(tmp_path: Path) -> None:
    source = read_source(
        finish(tf2onnx_like(tmp_path / "r.onnx"), tmp_path / "m.onnx", None, print)
    )
    options = raw_pixel_options(source, PackageOptions(), print)
    assert options.scale == 1.0
    with pytest.raises(PackagingError, match="raw 0..255 pixels.*--mean/--std"):
        raw_pixel_options(source, PackageOptions(mean=(0.5, 0.5, 0.5)), print)
    plain = read_source(tf2onnx_like(tmp_path / "plain.onnx"))  # no metadata: options kept
    assert raw_pixel_options(plain, PackageOptions(), print).scale == pytest.approx(1 / 255)


def test_frozen_graph_outputs_are_discovered_or_asked_for(tmp_path: Path) -> None:
    graph = tmp_path / "g.pb"
    od_api = GraphFacts(("image_tensor",), ("num_detections", *_od_shuffled()), None)
    assert _outputs(graph, od_api) == (
        "detection_boxes",
        "detection_classes",
        "detection_scores",
        "num_detections",
    )
    assert _outputs(graph, GraphFacts(("x",), ("logits",), None)) == ("logits",)
    many = GraphFacts(("x",), tuple(f"head_{i}" for i in range(9)), None)
    with pytest.raises(PackagingError, match=r"9 unconsumed nodes: head_0.*--tf-outputs"):
        _outputs(graph, many)


def _od_shuffled() -> tuple[str, ...]:
    return ("detection_scores", "detection_boxes", "detection_classes")


def test_tensorflow_sources_are_told_apart_and_a_missing_converter_names_the_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    saved = tmp_path / "saved"
    saved.mkdir()
    assert not is_tensorflow_source(str(saved))  # no saved_model.pb yet
    (saved / "saved_model.pb").write_bytes(b"")
    assert is_tensorflow_source(str(saved)) and is_tensorflow_source("frozen.pb")
    assert not is_tensorflow_source("model.onnx")
    monkeypatch.setenv("EDGEAGENT_TF_PYTHON", str(tmp_path / "no-python"))
    with pytest.raises(PackagingError, match="EDGEAGENT_TF_PYTHON=.*no such file"):
        export_tensorflow(str(saved), None, (), (), tmp_path, print)
    monkeypatch.delenv("EDGEAGENT_TF_PYTHON")
    if all(importlib.util.find_spec(m) for m in ("tensorflow", "tf2onnx")):
        pytest.skip("this Python has TensorFlow: it would convert in-process")
    step = r"run scripts/setup.sh \(its step 'TensorFlow converter environment \(.venv-tf\)'\)"
    with pytest.raises(PackagingError, match=step):
        tensorflow_python(tmp_path / "no-venv-tf" / "python")


def test_the_graphs_own_resize_filter_reaches_the_package(tmp_path: Path) -> None:
    """A graph that resizes with ResizeBicubic gets [preprocess] resize_filter = "bicubic":
    the filter travels in the ONNX's metadata, where the packager reads any model's."""
    from edgeagent.packaging.labels_meta import onnx_metadata, resize_filter_from_metadata
    from edgeagent.packaging.tensorflow_export import RESIZE_FILTERS

    metadata = {"resize_filter": RESIZE_FILTERS["ResizeBicubic"]}
    out = finish(tf2onnx_like(tmp_path / "r.onnx"), tmp_path / "m.onnx", None, print, metadata)
    assert resize_filter_from_metadata(onnx_metadata(out)) == "bicubic"
