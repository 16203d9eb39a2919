"""The packager's readings of a file (labels, detector head) and its by-task judgement."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest

from edgeagent.models.detection_head import DetectionHead
from edgeagent.packaging.detector_graph import grid_counts, recognise
from edgeagent.packaging.errors import PackagingError
from edgeagent.packaging.labels_meta import (
    image_size_from_metadata,
    names_from_metadata,
    resize_filter_from_metadata,
    tflite_label_file,
)
from edgeagent.packaging.task_checks import Head, Thresholds, detection_map, mean_mask_iou
from edgeagent.packaging.validate import VariantReport, judge

ULTRALYTICS = {"author": "Ultralytics", "task": "detect"}


def test_names_from_ultralytics_and_paddle_metadata() -> None:
    assert names_from_metadata({"names": "{0: 'person', 1: 'bicycle'}"}) == ("person", "bicycle")
    assert names_from_metadata({"character": "0\n180\n"}) == ("0", "180")
    assert names_from_metadata({"character": "['0', '90']"}) == ("0", "90")
    for hostile in ("{1: 'a'}", "__import__('os')", "[" * 100_000, "{0: 'a', 0.5: 'b'}", "{}"):
        assert names_from_metadata({"names": hostile}) is None, hostile
    assert names_from_metadata({"names": "{0: 'two\\nlines'}"}) == ("two lines",)
    assert image_size_from_metadata({"imgsz": "[320, 256]"}) == (320, 256)
    assert image_size_from_metadata({"imgsz": "[0, 99999]"}) is None


def test_resize_filter_from_metadata() -> None:
    assert resize_filter_from_metadata({"interpolation": "bicubic"}) == "bicubic"  # timm
    assert resize_filter_from_metadata({"resize_filter": "cv2.INTER_AREA"}) == "area"
    assert resize_filter_from_metadata({"resample": "LANCZOS"}) == "lanczos"
    assert resize_filter_from_metadata({"interpolation": "spline36"}) is None
    assert resize_filter_from_metadata({}) is None


def test_tflite_associated_label_file(tmp_path: Path) -> None:
    model = tmp_path / "m.tflite"
    model.write_bytes(b"TFL3 flatbuffer bytes")
    assert tflite_label_file(model) is None
    with zipfile.ZipFile(model, "a") as archive:  # metadata packs files as a zip after the model
        archive.writestr("labels.txt", "cat\ndog\n")
    assert tflite_label_file(model) == ("cat", "dog")


def test_yolo_heads_are_told_by_the_grid() -> None:
    assert grid_counts(640, 640) == {8400, 8500}
    v8 = recognise([(None, 84, 8400)], (640, 640), {}, None)
    assert v8 is not None and v8.head is not None and v8.classes == 80 and v8.letterbox
    assert not v8.head.objectness and v8.head.iou_threshold == 0.7
    open_n = recognise([(None, 22, None)], (320, 320), ULTRALYTICS, None)
    assert open_n is not None and open_n.classes == 18
    v5 = recognise([(1, 25200, 85)], (640, 640), {}, None)
    assert v5 is not None and v5.head is not None and v5.head.objectness and v5.classes == 80
    assert recognise([(1, 84, 8000)], (640, 640), {}, None) is None  # not that input's grid
    assert recognise([(1, 1000)], (224, 224), {}, None) is None  # a classifier
    nms = recognise([(1, 300, 6)], (640, 640), ULTRALYTICS, None)
    assert nms is not None and nms.head is None
    ssd = recognise([(1, 10, 4), (1, 10), (1, 10), (1,)], (300, 300), {}, None)
    assert ssd is not None and ssd.head is not None and ssd.head.style == "postprocessed"
    shuffled = recognise([(1,), (1, 10, 4), (1, 10), (1, 10)], (300, 300), {}, None)
    assert shuffled is not None and shuffled.head is None  # classes/scores order unknowable
    with pytest.raises(PackagingError, match="3 class names, but the detector's output scores 80"):
        recognise([(None, 84, 8400)], (640, 640), {}, ("a", "b", "c"))


def test_output_shapes_are_what_the_reference_answered() -> None:
    """A recogniser declaring [1, seqlen] that answers [T, 1, C]; open dimensions filled where
    the inputs are fixed, kept open where they follow an open input."""
    from edgeagent.models.package import TensorSpec
    from edgeagent.packaging.options import LogicalModel
    from edgeagent.packaging.self_described import answered_outputs

    def logical(input_shape: tuple[int, ...], output_shape: tuple[int, ...]) -> LogicalModel:
        return LogicalModel(
            (TensorSpec("x", "float32", input_shape),),
            (TensorSpec("y", "float32", output_shape),),
            None,
            "tensor",
        )

    stacked = {"y": np.zeros((4, 40, 1, 97), np.float32)}  # 4 feeds of [T=40, 1, C=97]
    fixed = answered_outputs(logical((1, 1, 64, 256), (1, -1)), stacked)
    assert fixed.outputs[0].shape == (40, 1, 97)
    open_width = answered_outputs(logical((1, 1, 64, -1), (1, -1)), stacked)
    assert open_width.outputs[0].shape == (-1, -1, -1)  # which of them follow the width: unknown
    rows = {"y": np.zeros((8, 1, 97, 32), np.float32)}  # a batching model's rows
    assert answered_outputs(logical((-1, 16000), (-1, 1, -1, 32)), rows).outputs[0].shape == (
        -1,
        1,
        97,
        32,
    )
    assert answered_outputs(logical((-1, -1), (-1, 1, -1, 32)), rows).outputs[0].shape == (
        -1,
        1,
        -1,
        32,
    )


def test_wide_unlabelled_scores_that_are_no_distribution_read_as_an_embedding() -> None:
    from edgeagent.packaging.probabilities import looks_like_embedding

    rng = np.random.default_rng(0)
    features = rng.uniform(0, 6, (4, 1280))  # pooled ReLU features
    assert looks_like_embedding(features) and looks_like_embedding(features[:, None, None])
    softmax = np.exp(features) / np.exp(features).sum(axis=1, keepdims=True)
    assert not looks_like_embedding(softmax)  # a distribution: class scores
    assert not looks_like_embedding(rng.standard_normal((4, 10)))  # ten logits: a classifier


def test_yolox_rows_are_not_taken_for_yolov8() -> None:
    """At 416 a YOLOX head has 3549 rows, YOLOv8's grid count: without Ultralytics' metadata
    rows first are YOLOX's (objectness, grid-relative centres, log sizes), not decoded."""
    assert 3549 in grid_counts(416, 416)
    yolox = recognise([(1, 3549, 6)], (416, 416), {}, None)
    assert yolox is not None and yolox.head is None and yolox.classes == 1
    assert "YOLOX-style rows [N, 5 + 1]" in yolox.what and "not decode" in yolox.what
    exported = recognise([(1, 3549, 6)], (416, 416), ULTRALYTICS, None)  # Ultralytics says so
    assert exported is not None and exported.head is not None and exported.classes == 2


def _yolo(rows: list[list[float]]) -> np.ndarray:
    """One image's [4 + C, N] output from rows of cx, cy, w, h, scores…"""
    return np.asarray(rows, np.float32).T[None]


def test_detection_map_against_fp32_boxes() -> None:
    head = Head(DetectionHead(iou_threshold=0.7), (64, 64), 2)
    fp32 = {"out": _yolo([[20, 20, 10, 10, 0.9, 0.0], [40, 40, 8, 8, 0.0, 0.8]])}
    same, _ = detection_map(head, ["out"], fp32, fp32)
    moved = {"out": _yolo([[20, 20, 10, 10, 0.9, 0.0], [50, 50, 8, 8, 0.0, 0.8]])}
    lost, count = detection_map(head, ["out"], fp32, moved)
    assert (same, count) == (1.0, 2) and lost == pytest.approx(0.5)


def test_mask_iou_of_binary_and_class_maps() -> None:
    ref = np.zeros((1, 8, 8, 1), np.float32)
    ref[0, :4] = 0.9
    half = ref.copy()
    half[0, :2] = 0.1
    assert mean_mask_iou(ref, ref) == 1.0 and mean_mask_iou(ref, half) == pytest.approx(0.5)
    classes = np.zeros((1, 3, 8, 8), np.float32)
    classes[0, 1, :4], classes[0, 2, 4:] = 1.0, 1.0
    assert mean_mask_iou(classes, classes) == 1.0


def test_judge_drops_by_the_task_figure() -> None:
    rules = Thresholds()
    boxes = VariantReport("onnxruntime", "int8", "cpu", "", max_abs_error=180.0, cosine_min=0.995)
    boxes.map_vs_fp32, boxes.fp32_boxes = 0.5, 3
    fine = VariantReport("openvino", "fp16", "cpu", "", max_abs_error=5.0, cosine_min=1.0)
    fine.map_vs_fp32, fine.fp32_boxes = 1.0, 3
    scores = VariantReport("openvino", "int8", "cpu", "", max_abs_error=1.0, cosine_min=1.0)
    scores.map_vs_fp32, scores.score_issue = 1.0, "scores range 0.000..1.249, outside 0..1"
    tensor = VariantReport("onnxruntime", "fp16", "cpu", "", max_abs_error=1.0, cosine_min=0.9)
    judge([boxes, fine, scores, tensor], 1.0, rules)
    assert [r.kept for r in (boxes, fine, scores, tensor)] == [False, True, False, False]
    assert "mAP@0.5 against fp32's 3 boxes is 0.5000, 50.00 points lost" in boxes.reason
    assert "1.249" in scores.reason and "--min-cosine 0.99" in tensor.reason
