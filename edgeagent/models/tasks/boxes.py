"""Detectors with a known head: the golden record is the reference's boxes, matched by IoU.

Comparing a detector's raw tensors would fail a healthy INT8 variant (thousands of cells, each
a little off) or pass a broken one (tolerances wide enough for INT8 hide a shifted box), so the
check compares what the detector answers: every golden box must be found again — same image,
same class, IoU at least ``box_iou``, score within ``score_tolerance`` — and no box scoring at
least ``confident`` may appear that the golden record lacks. Boxes are in model-input pixels,
as the package's own ``[detection]`` head decodes them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from edgeagent.models.tasks.detection import Detections, iou_matrix

KEYS = ("box_image", "boxes", "box_scores", "box_classes")
TOLERANCES = ("box_iou", "score_tolerance", "confident")


def record(
    found: Sequence[Detections], box_iou: float, score_tolerance: float, confident: float
) -> dict[str, np.ndarray]:
    """The confident detections of every golden input (``found[i]`` answers input i)."""
    kept = [(index, d, d.scores >= confident) for index, d in enumerate(found)]
    return {
        "box_image": np.array([i for i, _, k in kept for _ in range(int(k.sum()))], np.int64),
        "boxes": np.concatenate([np.zeros((0, 4)), *(d.boxes[k] for _, d, k in kept)]).astype(
            np.float32
        ),
        "box_scores": np.concatenate([np.zeros(0), *(d.scores[k] for _, d, k in kept)]).astype(
            np.float32
        ),
        "box_classes": np.concatenate(
            [np.zeros(0, np.int64), *(d.classes[k] for _, d, k in kept)]
        ).astype(np.int64),
        "box_iou": np.float64(box_iou),
        "score_tolerance": np.float64(score_tolerance),
        "confident": np.float64(confident),
    }


def is_record(golden: Mapping[str, np.ndarray]) -> bool:
    """Whether a golden file holds boxes (rather than a detector's raw tensors)."""
    return "boxes" in golden


def problem(golden: Mapping[str, np.ndarray], found: Sequence[Detections]) -> str:
    """Why the detections of the golden inputs (``found[i]`` answers input i) break the record."""
    missing = [k for k in (*KEYS, *TOLERANCES) if k not in golden]
    if missing:
        return f"the golden file lacks {', '.join(missing)}"
    images = np.asarray(golden["box_image"]).reshape(-1)
    if len(images) and int(images.max()) >= len(found):
        return f"{len(found)} answers for golden boxes on {int(images.max()) + 1} inputs"
    for index, answer in enumerate(found):
        mine = images == index
        trouble = _image_problem(
            np.asarray(golden["boxes"], np.float32).reshape(-1, 4)[mine],
            np.asarray(golden["box_scores"], np.float32).reshape(-1)[mine],
            np.asarray(golden["box_classes"]).reshape(-1)[mine],
            answer,
            float(golden["box_iou"]),
            float(golden["score_tolerance"]),
            float(golden["confident"]),
        )
        if trouble:
            return f"golden input {index}: {trouble}"
    return ""


def _image_problem(
    boxes: np.ndarray,
    scores: np.ndarray,
    classes: np.ndarray,
    found: Detections,
    box_iou: float,
    tolerance: float,
    confident: float,
) -> str:
    """Golden boxes of one input, best first, each claim the best unclaimed same-class box."""
    overlaps = iou_matrix(boxes, found.boxes) if len(found) else np.zeros((len(boxes), 0))
    overlaps = np.where(classes[:, None] == found.classes[None, :], overlaps, 0.0)
    claimed = np.zeros(len(found), bool)
    for row in np.argsort(-scores, kind="stable"):
        candidates = np.where(claimed, -1.0, overlaps[row])
        best = int(candidates.argmax()) if len(found) else -1
        if best < 0 or candidates[best] < box_iou:
            closest = float(overlaps[row].max(initial=0.0))
            return (
                f"no class-{int(classes[row])} box with IoU ≥ {box_iou:g} for golden box "
                f"{_box(boxes[row])} (closest IoU {closest:.2f})"
            )
        if abs(float(found.scores[best]) - float(scores[row])) > tolerance:
            return (
                f"golden box {_box(boxes[row])} scores {float(found.scores[best]):.3f}, "
                f"not {float(scores[row]):.3f} ± {tolerance:g}"
            )
        claimed[best] = True
    extra = ~claimed & (found.scores >= confident)
    if extra.any():
        first = int(np.flatnonzero(extra)[0])
        return (
            f"{int(extra.sum())} confident box(es) the golden record lacks, e.g. class "
            f"{int(found.classes[first])} at {_box(found.boxes[first])} "
            f"scoring {float(found.scores[first]):.3f}"
        )
    return ""


def _box(box: np.ndarray) -> str:
    return "[" + ", ".join(f"{float(v):.1f}" for v in box) + "]"
