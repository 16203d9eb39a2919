"""Mean average precision of detections against true boxes (PASCAL VOC / COCO style).

The zoo's build records a detector's mAP@0.5 per variant, the benchmark measures it through
the agent, and the tests hold the served model to it; all three must count the same way, so the
metric lives here once.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgeagent.models.tasks.detection import Detections, iou_matrix


def average_precision(recall: np.ndarray, precision: np.ndarray) -> float:
    """Area under the precision envelope (every-point interpolation, as VOC 2010+ and COCO)."""
    recall = np.concatenate([[0.0], recall, [1.0]])
    precision = np.concatenate([[0.0], precision, [0.0]])
    precision = np.maximum.accumulate(precision[::-1])[::-1]
    steps = np.nonzero(recall[1:] != recall[:-1])[0]
    return float(np.sum((recall[steps + 1] - recall[steps]) * precision[steps + 1]))


def _hits(found: Detections, boxes: np.ndarray, labels: np.ndarray, iou: float) -> np.ndarray:
    """Which detections of one image are true positives: greedy by score, each true box once,
    matched only by a detection of its own class."""
    hits = np.zeros(len(found), bool)
    if not len(found) or not len(boxes):
        return hits
    overlaps = iou_matrix(found.boxes, boxes)
    overlaps[found.classes[:, None] != labels[None, :]] = 0.0
    taken = np.zeros(len(boxes), bool)
    for row in np.argsort(-found.scores, kind="stable"):
        candidates = np.where(taken, -1.0, overlaps[row])
        best = int(candidates.argmax())
        if candidates[best] >= iou:
            taken[best] = hits[row] = True
    return hits


def mean_average_precision(
    detections: Sequence[Detections],
    boxes: Sequence[np.ndarray],
    labels: Sequence[np.ndarray],
    classes: int,
    iou: float = 0.5,
) -> float:
    """mAP@``iou`` over the classes that occur in the truth, per-image boxes in the same pixels.

    ``boxes[i]`` is image i's ``[k, 4]`` corner boxes and ``labels[i]`` their classes.
    """
    hits = [_hits(d, b, lab, iou) for d, b, lab in zip(detections, boxes, labels, strict=True)]
    all_hits = np.concatenate([np.zeros(0, bool), *hits])
    all_scores = np.concatenate([np.zeros(0, np.float32), *(d.scores for d in detections)])
    all_classes = np.concatenate([np.zeros(0, np.int64), *(d.classes for d in detections)])
    truth = np.concatenate([np.zeros(0, np.int64), *labels])
    precisions = []
    for cls in range(classes):
        positives = int((truth == cls).sum())
        if positives == 0:
            continue
        mine = all_classes == cls
        ranked = all_hits[mine][np.argsort(-all_scores[mine], kind="stable")]
        true_pos = np.cumsum(ranked)
        recall = true_pos / positives
        precision = true_pos / np.arange(1, len(ranked) + 1)
        precisions.append(average_precision(recall, precision) if len(ranked) else 0.0)
    return float(np.mean(precisions)) if precisions else 0.0
