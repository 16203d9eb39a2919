"""Each variant judged by what its task means, against the fp32 reference's answers.

Max absolute error says nothing a user can act on: an INT8 YOLO head 150 px off on one cell
may still find every box, or may find none of them. So each task is compared by what it
answers: a classifier by its top-1 class (``validate.compare``), a detector with a known head
by its decoded boxes (mAP@0.5 of the variant's boxes against fp32's, both through the
package's own ``[detection]`` head and NMS, plus the range of its scores), a segmentation
model by the mean IoU of its masks, anything else by cosine similarity and relative error.

The defaults, and why:

- ``min_map = 0.98``: a variant may lose at most 2 mAP points against fp32's own boxes (the
  issue's acceptance rule). The reference boxes are fp32's at the package's score threshold;
  the variant's are decoded down to ``MAP_SCORE_FLOOR`` so a box that drops just under the
  threshold costs ranking, not a miss (as COCO evaluation decodes at 0.001).
- scores must stay inside [0, 1] when fp32's are (a sigmoid head whose INT8 answers 1.255 is
  broken whatever its boxes say).
- ``min_mask_iou = 0.9``: INT8 segmentation that keeps its masks measures 0.95 and more; below
  0.9 object edges visibly move.
- ``min_cosine = 0.99`` and ``max_relative_error = 0.15``: for vectors of equal length
  ``|a - b| / |a| = sqrt(2 (1 - cos))``, so the two bounds agree (0.99 ↔ 0.14); per-channel
  INT8 keeps cosine above 0.995 on healthy models, a saturating one falls far below (the
  digits model without reduce_range: 0.776).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from edgeagent.models.detection_head import DetectionHead
from edgeagent.models.tasks import boxes as golden_boxes
from edgeagent.models.tasks import decode
from edgeagent.models.tasks.detection import Detections, Geometry, iou_matrix
from edgeagent.models.tasks.detection_map import mean_average_precision

MAP_SCORE_FLOOR = 0.001  # the variant's boxes are ranked from here (COCO evaluation's floor)
SCORE_SLACK = 1e-3  # rounding of a dequantized sigmoid at its ends


@dataclass(frozen=True)
class Thresholds:
    """What a variant must reach against fp32 to be kept, per task (each a command flag)."""

    min_map: float = 0.98
    min_mask_iou: float = 0.9
    min_cosine: float = 0.99
    max_relative_error: float = 0.15


@dataclass(frozen=True)
class Head:
    """A detector's head as the package will declare it, with what decoding needs."""

    head: DetectionHead
    input_size: tuple[int, int]  # (width, height)
    classes: int
    anchors: np.ndarray | None = None

    def decode_rows(
        self, outputs: Mapping[str, np.ndarray], names: Sequence[str], floor: float | None = None
    ) -> list[Detections]:
        """Every row of a batch → detections in model-input pixels (no mapping back)."""
        head = self.head if floor is None else replace(self.head, score_threshold=floor)
        identity = Geometry((1.0, 1.0), (0.0, 0.0), self.input_size)
        arrays = [np.asarray(outputs[n]) for n in names]
        return [
            head.decode(
                [a[row] for a in arrays], self.input_size, identity, self.classes, self.anchors
            )
            for row in range(len(arrays[0]))
        ]

    def score_range(
        self, outputs: Mapping[str, np.ndarray], names: Sequence[str]
    ) -> tuple[float, float]:
        """Lowest and highest class score (after the head's activation) over every candidate."""
        arrays = [np.asarray(outputs[n]) for n in names]
        low, high = np.inf, -np.inf
        if self.head.style not in ("yolo", "ssd"):  # rows the graph chose: their own scores
            found = self.decode_rows(outputs, names, floor=0.0)
            scores = np.concatenate([np.zeros(0, np.float32), *(d.scores for d in found)])
            return (float(scores.min()), float(scores.max())) if scores.size else (0.0, 0.0)
        for row in range(len(arrays[0])):
            if self.head.style == "yolo":
                _, scores = decode.yolo_candidates(
                    arrays[0][row],
                    self.input_size,
                    self.classes,
                    box_format=self.head.box_format,
                    normalized=self.head.normalized,
                    objectness=self.head.objectness,
                    activation=self.head.activation,
                )
            else:
                assert self.anchors is not None
                _, scores = decode.ssd_candidates(
                    arrays[0][row],
                    arrays[1][row],
                    self.anchors,
                    self.input_size,
                    variances=self.head.variances,
                    activation=self.head.activation,
                    background=self.head.background,
                )
            if scores.size:
                low, high = min(low, float(scores.min())), max(high, float(scores.max()))
        return (low, high) if np.isfinite(low) else (0.0, 0.0)


def detection_map(
    head: Head,
    names: Sequence[str],
    reference: Mapping[str, np.ndarray],
    outputs: Mapping[str, np.ndarray],
) -> tuple[float | None, int]:
    """mAP@0.5 of the variant's boxes against fp32's, and how many fp32 boxes there were
    (None when fp32 found none: there is nothing to match)."""
    truth = head.decode_rows(reference, names)
    found = head.decode_rows(outputs, names, floor=MAP_SCORE_FLOOR)
    count = sum(len(t) for t in truth)
    if count == 0:
        return None, 0
    value = mean_average_precision(
        found, [t.boxes for t in truth], [t.classes for t in truth], head.classes, iou=0.5
    )
    return value, count


def score_problem(reference: tuple[float, float], variant: tuple[float, float]) -> str:
    """Why the variant's score range is wrong, or "": outside [0, 1] where fp32 is inside."""
    inside = reference[0] >= -SCORE_SLACK and reference[1] <= 1 + SCORE_SLACK
    if inside and (variant[0] < -SCORE_SLACK or variant[1] > 1 + SCORE_SLACK):
        return (
            f"scores range {variant[0]:.3f}..{variant[1]:.3f}, outside 0..1 where fp32's "
            f"({reference[0]:.3f}..{reference[1]:.3f}) are inside"
        )
    return ""


def _channel_axis(shape: tuple[int, ...]) -> int | None:
    """Where a mask's classes sit: the smaller of dimension 1 and the last of a 4-D output."""
    if len(shape) != 4:
        return None
    return 1 if shape[1] <= shape[-1] else 3


def masks(values: np.ndarray, probabilities: bool) -> np.ndarray:
    """Per-pixel class: argmax over the classes, or a threshold on a single-channel map
    (0.5 on probabilities, 0 on logits)."""
    axis = _channel_axis(values.shape)
    if axis is not None and values.shape[axis] > 1:
        return np.argmax(values, axis=axis)
    flat = values if axis is None else np.squeeze(values, axis=axis)
    return (flat > (0.5 if probabilities else 0.0)).astype(np.int64)


def mean_mask_iou(reference: np.ndarray, variant: np.ndarray) -> float:
    """Mean IoU over the classes either mask contains (1.0 when both are empty of all)."""
    probabilities = bool(reference.min() >= 0 and reference.max() <= 1)
    axis = _channel_axis(reference.shape)
    binary = axis is None or reference.shape[axis] == 1
    ref, got = masks(reference, probabilities), masks(variant, probabilities)
    # a binary map is judged by its foreground (the background is the rest of it)
    classes = np.asarray([1]) if binary else np.union1d(np.unique(ref), np.unique(got))
    ious = []
    for cls in classes:
        a, b = ref == cls, got == cls
        union = int(np.logical_or(a, b).sum())
        ious.append(1.0 if union == 0 else int(np.logical_and(a, b).sum()) / union)
    return float(np.mean(ious)) if ious else 1.0


def relative_error(reference: np.ndarray, variant: np.ndarray) -> float:
    """The largest per-row ``|variant - reference| / |reference|`` (L2 over the row)."""
    ref = reference.reshape(len(reference), -1).astype(np.float64)
    got = variant.reshape(len(variant), -1).astype(np.float64)
    norms = np.linalg.norm(ref, axis=1)
    errors = np.linalg.norm(got - ref, axis=1) / np.maximum(norms, 1e-12)
    errors[np.all(ref == got, axis=1)] = 0.0
    return float(errors.max()) if len(errors) else 0.0


def golden_boxes_record(
    head: Head,
    names: Sequence[str],
    reference: Mapping[str, np.ndarray],
    kept: Sequence[Mapping[str, np.ndarray]],
    rows: int,
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Golden rows and their box record, with tolerances from what the kept variants measured.

    The boxes are fp32's; ``box_iou`` and ``score_tolerance`` are set from the worst kept
    variant on the chosen rows (with a margin), and only rows every kept variant passes with
    them are golden, so a later health check of a kept variant cannot fail on its own noise.
    """
    truth = head.decode_rows(reference, names)
    answers = [head.decode_rows(a, names) for a in kept]
    worst_iou, worst_score = 1.0, 0.0
    for answer in answers:
        for ref, got in zip(truth, answer, strict=True):
            iou, score = _match(ref, got)
            worst_iou, worst_score = min(worst_iou, iou), max(worst_score, score)
    box_iou = float(np.clip(worst_iou - 0.1, 0.5, 0.9))
    tolerance = float(np.clip(2 * worst_score, 0.02, 0.25))
    confident = min(1.0, head.head.score_threshold + tolerance)
    record = golden_boxes.record(truth, box_iou, tolerance, confident)
    passing = [
        i
        for i in range(len(truth))
        if all(golden_boxes.problem(_one(record, i), [answer[i]]) == "" for answer in answers)
    ]
    with_boxes = [i for i in passing if len(truth[i]) and truth[i].scores.max() >= confident]
    chosen = (with_boxes + [i for i in passing if i not in with_boxes])[:rows]
    chosen = sorted(chosen or range(min(rows, len(truth))))
    return np.asarray(chosen, dtype=np.int64), golden_boxes.record(
        [truth[i] for i in chosen], box_iou, tolerance, confident
    )


def _one(record: Mapping[str, np.ndarray], index: int) -> dict[str, np.ndarray]:
    """Row ``index`` of a box record, renumbered as row 0."""
    mine = np.asarray(record["box_image"]) == index
    return {
        **{k: record[k] for k in golden_boxes.TOLERANCES},
        "box_image": np.zeros(int(mine.sum()), np.int64),
        "boxes": np.asarray(record["boxes"])[mine],
        "box_scores": np.asarray(record["box_scores"])[mine],
        "box_classes": np.asarray(record["box_classes"])[mine],
    }


def _match(reference: Detections, variant: Detections) -> tuple[float, float]:
    """Lowest best-IoU (same class) of the reference's boxes, and the largest score change."""
    if not len(reference):
        return 1.0, 0.0
    if not len(variant):
        return 0.0, 1.0
    overlaps = iou_matrix(reference.boxes, variant.boxes)
    overlaps = np.where(reference.classes[:, None] == variant.classes[None, :], overlaps, 0.0)
    best = overlaps.argmax(axis=1)
    ious = overlaps[np.arange(len(best)), best]
    scores = np.abs(reference.scores - variant.scores[best])
    matched = ious > 0
    return float(ious.min()), float(scores[matched].max()) if matched.any() else 1.0
