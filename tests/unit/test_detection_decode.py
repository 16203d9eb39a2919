"""Detection decoding against hand-computed boxes: both head styles, NMS, coordinate mapping."""

from __future__ import annotations

import numpy as np
import pytest

from edgeagent.models.tasks.detection import (
    DetectionHead,
    crop_geometry,
    iou_matrix,
    letterbox_geometry,
    nms,
    ssd_anchors,
    stretch_geometry,
    to_original,
)

IDENTITY = stretch_geometry((100, 100), (100, 100))


def test_yolo_v8_rows_centre_boxes_in_pixels():
    # Two candidates, two classes: [cx, cy, w, h, score_a, score_b]
    rows = np.array(
        [
            [50, 40, 20, 10, 0.1, 0.9],  # class 1, box 40..60 × 35..45
            [10, 10, 4, 4, 0.3, 0.05],  # class 0, below the 0.5 threshold
        ],
        np.float32,
    )
    head = DetectionHead(score_threshold=0.5)
    found = head.decode([rows], (100, 100), IDENTITY, num_classes=2)
    assert found.classes.tolist() == [1]
    np.testing.assert_allclose(found.boxes, [[40, 35, 60, 45]])
    np.testing.assert_allclose(found.scores, [0.9])


def test_yolo_transposed_export_is_read_the_same():
    rows = np.array([[50, 40, 20, 10, 0.1, 0.9], [20, 20, 10, 10, 0.8, 0.1]], np.float32)
    head = DetectionHead(score_threshold=0.5)
    plain = head.decode([rows], (100, 100), IDENTITY, num_classes=2)
    transposed = head.decode([rows.T.copy()], (100, 100), IDENTITY, num_classes=2)
    np.testing.assert_allclose(plain.boxes, transposed.boxes)
    assert plain.classes.tolist() == transposed.classes.tolist() == [1, 0]


def test_yolo_v5_objectness_multiplies_and_corner_normalised_boxes_scale():
    # [x1, y1, x2, y2 (0..1), objectness, class scores]
    rows = np.array([[0.1, 0.2, 0.5, 0.6, 0.5, 0.2, 0.8]], np.float32)
    head = DetectionHead(box_format="xyxy", normalized=True, objectness=True, score_threshold=0.3)
    found = head.decode([rows], (200, 100), stretch_geometry((200, 100), (200, 100)), 2)
    np.testing.assert_allclose(found.boxes, [[20, 20, 100, 60]])
    np.testing.assert_allclose(found.scores, [0.4])  # 0.5 × 0.8
    assert found.classes.tolist() == [1]


def test_yolo_output_of_the_wrong_width_is_refused_with_its_shape():
    with pytest.raises(ValueError, match=r"\[N, 7\].*\[3, 6\]"):
        DetectionHead().decode([np.zeros((3, 6), np.float32)], (10, 10), IDENTITY, 3)


def test_ssd_regression_against_anchors_with_variances_and_softmax_background():
    anchors = np.array([[0.5, 0.5, 0.2, 0.4], [0.25, 0.25, 0.1, 0.1]], np.float32)
    # anchor 0: shift cx by +1 (× 0.1 × 0.2 = +0.02), log-scale w by ln(2)/0.2 → w doubles
    loc = np.array([[1.0, 0.0, np.log(2.0) / 0.2, 0.0], [0, 0, 0, 0]], np.float32)
    conf = np.array([[0.0, 5.0, 0.0], [5.0, 0.0, 0.0]], np.float32)  # background, a, b
    head = DetectionHead(style="ssd", activation="softmax", background=True, score_threshold=0.5)
    found = head.decode([loc, conf], (100, 100), IDENTITY, 2, anchors=anchors)
    assert found.classes.tolist() == [0]  # anchor 1 is background
    # cx = 0.52, cy = 0.5, w = 0.4, h = 0.4 → (32, 30, 72, 70) in 100 px
    np.testing.assert_allclose(found.boxes, [[32, 30, 72, 70]], atol=1e-4)


def test_ssd_without_anchors_or_with_the_wrong_count_is_refused():
    head = DetectionHead(style="ssd")
    loc, conf = np.zeros((3, 4), np.float32), np.zeros((3, 2), np.float32)
    with pytest.raises(ValueError, match="needs its anchors"):
        head.decode([loc, conf], (10, 10), IDENTITY, 2)
    with pytest.raises(ValueError, match="2 anchors for 3"):
        head.decode([loc, conf], (10, 10), IDENTITY, 2, anchors=np.zeros((2, 4), np.float32))


def test_ssd_anchor_generation_counts_and_centres():
    anchors = ssd_anchors([2, 1], [0.3, 0.6, 0.9], aspect_ratios=(1.0, 2.0))
    assert anchors.shape == ((2 * 2 + 1) * 3, 4)
    # first cell of the 2×2 map: centre (0.25, 0.25), square at scale 0.3 first
    np.testing.assert_allclose(anchors[0], [0.25, 0.25, 0.3, 0.3], rtol=1e-6)
    np.testing.assert_allclose(anchors[1, 2:], [0.3 * np.sqrt(2), 0.3 / np.sqrt(2)], rtol=1e-6)
    np.testing.assert_allclose(anchors[2, 2:], [np.sqrt(0.18)] * 2, rtol=1e-6)
    np.testing.assert_allclose(anchors[-1], [0.5, 0.5, np.sqrt(0.54), np.sqrt(0.54)], rtol=1e-6)


# ---- NMS edge cases -----------------------------------------------------------------------


def test_nms_with_no_boxes_keeps_nothing():
    empty = np.zeros((0, 4), np.float32)
    assert nms(empty, np.zeros(0), np.zeros(0, np.int64), 0.5, 10).tolist() == []
    found = DetectionHead().decode([np.zeros((0, 6), np.float32)], (10, 10), IDENTITY, 2)
    assert len(found) == 0


def test_nms_all_overlapping_keeps_the_best_one():
    boxes = np.array([[0, 0, 10, 10], [1, 1, 10, 10], [0, 0, 9, 9]], np.float32)
    scores = np.array([0.6, 0.9, 0.7])
    assert nms(boxes, scores, np.zeros(3, np.int64), 0.5, 10).tolist() == [1]


def test_nms_is_per_class():
    boxes = np.array([[0, 0, 10, 10], [0, 0, 10, 10]], np.float32)
    kept = nms(boxes, np.array([0.9, 0.8]), np.array([0, 1]), 0.5, 10)
    assert kept.tolist() == [0, 1]


def test_nms_restores_a_box_whose_suppressor_was_itself_suppressed():
    # A chain: a (0.9) overlaps b (0.8) and b overlaps c (0.7) above 0.3; a and c overlap
    # less. Greedy keeps a, drops b, and therefore keeps c (a "fast NMS" would drop c too).
    boxes = np.array([[0, 0, 10, 10], [3, 0, 13, 10], [7, 0, 17, 10]], np.float32)
    scores = np.array([0.9, 0.8, 0.7])
    iou = iou_matrix(boxes, boxes)
    assert iou[0, 1] > 0.3 and iou[1, 2] > 0.3 and iou[0, 2] < 0.3
    assert nms(boxes, scores, np.zeros(3, np.int64), 0.3, 10).tolist() == [0, 2]


def test_nms_many_classes_and_the_detection_cap():
    rng = np.random.default_rng(0)
    corners = rng.uniform(0, 90, (500, 2)).astype(np.float32)
    boxes = np.concatenate([corners, corners + 10], axis=1)
    scores = rng.uniform(0, 1, 500)
    classes = rng.integers(0, 80, 500)
    kept = nms(boxes, scores, classes, 0.5, 25)
    assert len(kept) == 25
    assert np.all(np.diff(scores[kept]) <= 0)  # best first
    # No two kept boxes of one class overlap above the threshold.
    iou = iou_matrix(boxes[kept], boxes[kept])
    same = classes[kept][:, None] == classes[kept][None, :]
    np.fill_diagonal(same, False)
    assert not np.any((iou > 0.5) & same)


def test_min_score_raises_the_threshold_for_one_request():
    rows = np.array([[5, 5, 2, 2, 0.6], [20, 20, 2, 2, 0.9]], np.float32)
    head = DetectionHead(score_threshold=0.5)
    assert len(head.decode([rows], (30, 30), IDENTITY, 1)) == 2
    assert len(head.decode([rows], (30, 30), IDENTITY, 1, min_score=0.8)) == 1


# ---- back to the original image ----------------------------------------------------------


def test_letterbox_mapping_undoes_scale_and_padding():
    # 200×100 image letterboxed into 100×100: scale 0.5, 25 px of padding top and bottom.
    geometry = letterbox_geometry((200, 100), (100, 100))
    assert geometry.scale == (0.5, 0.5) and geometry.offset == (0.0, 25.0)
    model_box = np.array([[10, 35, 60, 60]], np.float32)
    np.testing.assert_allclose(to_original(model_box, geometry), [[20, 20, 120, 70]])


def test_crop_mapping_undoes_resize_and_centre_crop():
    # 400×200 image: shorter side 100 → 200×100, centre crop 100×100 starts at x = 50.
    geometry = crop_geometry((400, 200), (100, 100), shorter=100)
    model_box = np.array([[0, 0, 100, 100]], np.float32)
    np.testing.assert_allclose(to_original(model_box, geometry), [[100, 0, 300, 200]])


def test_mapped_boxes_are_clipped_to_the_image():
    geometry = stretch_geometry((50, 50), (100, 100))
    np.testing.assert_allclose(
        to_original(np.array([[-20, 10, 140, 90]], np.float32), geometry), [[0, 5, 50, 45]]
    )


def _tf_outputs() -> list[np.ndarray]:
    """TF Object Detection API style: 4 padded rows, 2 valid, ids from 1, boxes ymin-first."""
    boxes = np.array(
        [[0.1, 0.2, 0.5, 0.6], [0.0, 0.0, 0.2, 0.4], [0.3, 0.3, 0.4, 0.4], [0, 0, 0, 0]],
        np.float32,
    )
    classes = np.array([1, 3, 2, 0], np.float32)
    scores = np.array([0.6, 0.9, 0.8, 0.0], np.float32)
    return [boxes, classes, scores, np.array(2, np.float32)]


def test_a_postprocessed_head_reads_yxyx_boxes_ids_and_count():
    head = DetectionHead(
        style="postprocessed", box_format="yxyx", normalized=True, first_class_id=1
    )
    geometry = stretch_geometry((400, 200), (100, 100))  # the image was stretched to 100²
    found = head.decode(_tf_outputs(), (100, 100), geometry, num_classes=90)
    # only the 2 counted rows, best first; the third (0.8) lies beyond num_detections
    np.testing.assert_allclose(found.scores, [0.9, 0.6])
    assert found.classes.tolist() == [2, 0]  # ids 3 and 1 → label indices
    np.testing.assert_allclose(found.boxes, [[0, 0, 160, 40], [80, 20, 240, 100]], atol=1e-4)


def test_a_postprocessed_head_applies_threshold_cap_and_drops_background_ids():
    outputs = _tf_outputs()
    outputs[3] = np.array(4, np.float32)  # every row counted: the padded row has id 0
    head = DetectionHead(
        style="postprocessed",
        box_format="yxyx",
        normalized=True,
        first_class_id=1,
        score_threshold=0.0,
        max_detections=2,
    )
    found = head.decode(outputs, (100, 100), IDENTITY, num_classes=90)
    np.testing.assert_allclose(found.scores, [0.9, 0.8])  # capped at 2; id 0 never appears
    three = head.decode(outputs[:3], (100, 100), IDENTITY, 90, min_score=0.7)
    np.testing.assert_allclose(three.scores, [0.9, 0.8])  # no count output: all rows read


def test_a_postprocessed_head_refuses_outputs_that_disagree():
    head = DetectionHead(style="postprocessed")
    boxes, classes, scores = np.zeros((3, 4)), np.zeros(3), np.zeros(2)
    with pytest.raises(ValueError, match="disagree on the row count"):
        head.decode([boxes, classes, scores], (10, 10), IDENTITY, 1)
    with pytest.raises(ValueError, match="boxes, classes, scores"):
        head.decode([boxes, classes], (10, 10), IDENTITY, 1)
