"""A detector's golden check matches boxes by IoU: jitter passes; shifted, missing, relabelled,
re-scored or extra confident boxes fail, each with the reason named."""

from __future__ import annotations

import numpy as np
import pytest

from edgeagent.models.tasks import boxes, golden_problem
from edgeagent.models.tasks.detection import Detections

GOLDEN = [
    Detections(
        np.array([[10, 10, 50, 40], [60, 20, 90, 80]], np.float32),
        np.array([0.9, 0.7], np.float32),
        np.array([0, 2]),
    ),
    Detections(np.array([[5, 5, 30, 30]], np.float32), np.array([0.8], np.float32), np.array([1])),
]


def detections(box_rows, scores, classes) -> Detections:
    return Detections(
        np.asarray(box_rows, np.float32).reshape(-1, 4),
        np.asarray(scores, np.float32),
        np.asarray(classes, np.int64),
    )


def record() -> dict[str, np.ndarray]:
    return boxes.record(GOLDEN, box_iou=0.7, score_tolerance=0.1, confident=0.5)


def test_the_reference_itself_passes():
    assert boxes.problem(record(), GOLDEN) == ""


def test_small_jitter_in_boxes_and_scores_passes():
    jittered = [
        detections([[11, 9, 51, 41], [59, 21, 91, 79]], [0.85, 0.76], [0, 2]),
        detections([[6, 5, 29, 31]], [0.88], [1]),
    ]
    assert boxes.problem(record(), jittered) == ""


def test_unconfident_extra_boxes_are_allowed():
    extra = [
        detections(
            [[10, 10, 50, 40], [60, 20, 90, 80], [0, 60, 20, 90]], [0.9, 0.7, 0.3], [0, 2, 3]
        ),
        GOLDEN[1],
    ]
    assert boxes.problem(record(), extra) == ""


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (
            [detections([[30, 10, 70, 40], [60, 20, 90, 80]], [0.9, 0.7], [0, 2]), GOLDEN[1]],
            "golden input 0: no class-0 box with IoU ≥ 0.7",
        ),
        ([detections([[60, 20, 90, 80]], [0.7], [2]), GOLDEN[1]], "no class-0 box"),
        ([GOLDEN[0], detections([], [], [])], "golden input 1: no class-1 box"),
        (
            [detections([[10, 10, 50, 40], [60, 20, 90, 80]], [0.9, 0.7], [1, 2]), GOLDEN[1]],
            "no class-0 box",
        ),
        (
            [detections([[10, 10, 50, 40], [60, 20, 90, 80]], [0.6, 0.7], [0, 2]), GOLDEN[1]],
            "scores 0.600, not 0.900 ± 0.1",
        ),
        (
            [GOLDEN[0], detections([[5, 5, 30, 30], [50, 50, 90, 90]], [0.8, 0.6], [1, 3])],
            "golden input 1: 1 confident box(es) the golden record lacks",
        ),
        ([GOLDEN[0]], "1 answers for golden boxes on 2 inputs"),
    ],
    ids=["shifted", "missing", "no-box-at-all", "relabelled", "score-moved", "extra", "too-few"],
)
def test_broken_answers_fail_with_the_reason(answer, reason):
    assert reason in boxes.problem(record(), answer)


def test_one_box_cannot_answer_two_golden_boxes():
    golden = [
        detections([[10, 10, 50, 50], [12, 12, 52, 52]], [0.9, 0.8], [0, 0]),
    ]
    stored = boxes.record(golden, box_iou=0.7, score_tolerance=0.2, confident=0.5)
    assert "no class-0 box" in boxes.problem(stored, [detections([[11, 11, 51, 51]], [0.85], [0])])


def test_a_record_without_tolerances_is_refused():
    stored = record()
    del stored["box_iou"]
    assert "lacks box_iou" in boxes.problem(stored, GOLDEN)


def test_the_task_dispatch_decodes_detector_outputs_only_for_box_records():
    stored = record()
    outputs = {"detections": np.zeros((2, 3, 8), np.float32)}
    assert (
        golden_problem("detection", ["detections"], stored, outputs, decode=lambda _: GOLDEN) == ""
    )
    shifted = [GOLDEN[0], detections([[25, 5, 50, 30]], [0.8], [1])]
    assert "golden input 1" in golden_problem(
        "detection", ["detections"], stored, outputs, decode=lambda _: shifted
    )
    assert "no [detection] head" in golden_problem("detection", ["detections"], stored, outputs)
