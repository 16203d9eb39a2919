"""The numeric half of a detector's head: raw outputs → scored candidates → kept boxes.

Two head families cover what edge detectors ship:

- **YOLO-style**: one row per candidate, ``[N, 4 + C]`` (YOLOv8 and later, class scores only)
  or ``[N, 5 + C]`` (YOLOv5: an objectness score first), boxes as centre + size or corners, in
  input pixels or normalised to 0..1. Exports often transpose it to ``[4 + C, N]``; the decoder
  accepts both.
- **SSD-style**: box regressions against a fixed set of anchors (``[A, 4]`` offsets in
  cx, cy, w, h order scaled by variances, the SSD paper's encoding) plus per-anchor class
  scores, sigmoid, or softmax with a background column.
- **Post-processed** (NMS in the graph, the TF Object Detection API's and TFLite's
  detection post-process): ``boxes [K, 4]`` (ymin, xmin, ymax, xmax, normalised), ``classes
  [K]`` (class ids, the first label's id given), ``scores [K]`` and optionally ``count``, the
  number of valid rows; only the threshold, the row cap and the mapping back are left to do.

Everything after the network is vectorised numpy: the score threshold, the per-class NMS (an
exact greedy NMS computed as a fixed point over the IoU matrix, with no per-box Python loop)
and the mapping back through the preprocessing to the caller's pixels. The functions take the
head's settings as plain arguments: the parsed ``[detection]`` table
(:class:`edgeagent.models.detection_head.DetectionHead`) has no numpy in it, so reading a
package never loads this module, and the head calls in here only when it decodes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgeagent.models.names import BoxFormat, ScoreActivation

MAX_NMS_CANDIDATES = 2000  # above this, only the best-scoring candidates enter NMS


@dataclass(frozen=True)
class Detections:
    """Boxes as ``[x_min, y_min, x_max, y_max]`` rows, with their scores and class indices."""

    boxes: np.ndarray  # float32 [K, 4]
    scores: np.ndarray  # float32 [K]
    classes: np.ndarray  # int64 [K]

    def __len__(self) -> int:
        return len(self.scores)


@dataclass(frozen=True)
class Geometry:
    """How the model's input pixels relate to the original image: ``orig = (x - offset) / scale``.

    ``scale`` and ``offset`` are per axis (x, y); ``size`` is the original (width, height), to
    which mapped boxes are clipped.
    """

    scale: tuple[float, float]
    offset: tuple[float, float]
    size: tuple[int, int]


def to_original(boxes: np.ndarray, geometry: Geometry) -> np.ndarray:
    """Map ``[K, 4]`` corner boxes from model-input pixels to the original image, clipped."""
    scale = np.asarray(geometry.scale * 2, dtype=np.float32)  # sx, sy, sx, sy
    offset = np.asarray(geometry.offset * 2, dtype=np.float32)
    mapped = (boxes - offset) / scale
    width, height = geometry.size
    limits = np.asarray([width, height, width, height], dtype=np.float32)
    return np.clip(mapped, 0.0, limits).astype(np.float32)


def corners(boxes: np.ndarray, box_format: BoxFormat) -> np.ndarray:
    """``[K, 4]`` boxes in ``box_format`` → corners ``x_min, y_min, x_max, y_max``."""
    if box_format == "xyxy":
        return boxes.astype(np.float32, copy=False)
    if box_format == "yxyx":
        return boxes[:, [1, 0, 3, 2]].astype(np.float32)
    cx, cy, w, h = boxes.T
    return np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1).astype(np.float32)


def activate(scores: np.ndarray, activation: ScoreActivation) -> np.ndarray:
    if activation == "sigmoid":
        return (1.0 / (1.0 + np.exp(-scores))).astype(np.float32)
    if activation == "softmax":
        shifted = scores - scores.max(axis=-1, keepdims=True)
        exp = np.exp(shifted)
        return (exp / exp.sum(axis=-1, keepdims=True)).astype(np.float32)
    return scores.astype(np.float32, copy=False)


def iou_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Intersection over union of every box in ``a`` [K, 4] with every box in ``b`` [M, 4]."""
    top_left = np.maximum(a[:, None, :2], b[None, :, :2])
    bottom_right = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(bottom_right - top_left, 0.0, None), axis=2)
    area_a = np.prod(np.clip(a[:, 2:] - a[:, :2], 0.0, None), axis=1)
    area_b = np.prod(np.clip(b[:, 2:] - b[:, :2], 0.0, None), axis=1)
    union = area_a[:, None] + area_b[None, :] - inter
    return np.where(union > 0, inter / np.maximum(union, 1e-12), 0.0)


def nms(
    boxes: np.ndarray,
    scores: np.ndarray,
    classes: np.ndarray,
    iou_threshold: float,
    max_detections: int,
) -> np.ndarray:
    """Indices kept by greedy per-class NMS, best score first.

    Greedy NMS keeps box j unless a *kept* better box of its class overlaps it above the
    threshold. That recurrence is solved as a fixed point: start with every box kept, and
    recompute "no kept better box overlaps me" from the IoU matrix until nothing changes; each
    round only removes boxes or restores boxes whose suppressor was itself removed, and it
    settles in as many rounds as the longest chain of suppressions (a handful in practice).
    """
    if len(scores) == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.argsort(-scores, kind="stable")[:MAX_NMS_CANDIDATES]
    ordered = boxes[order]
    same_class = classes[order][:, None] == classes[order][None, :]
    better = np.triu(np.ones((len(order), len(order)), dtype=bool), k=1)  # row i beats col j
    suppresses = (iou_matrix(ordered, ordered) > iou_threshold) & same_class & better
    keep = np.ones(len(order), dtype=bool)
    for _ in range(len(order)):  # bounded; converges in a few rounds
        updated = ~(suppresses & keep[:, None]).any(axis=0)
        if np.array_equal(updated, keep):
            break
        keep = updated
    return order[keep][:max_detections]


def yolo_candidates(
    raw: np.ndarray,
    input_size: tuple[int, int],
    num_classes: int,
    *,
    box_format: BoxFormat,
    normalized: bool,
    objectness: bool,
    activation: ScoreActivation,
) -> tuple[np.ndarray, np.ndarray]:
    """A YOLO-style output → corner boxes in input pixels [N, 4] and class scores [N, C]."""
    extra = 5 if objectness else 4
    width = extra + num_classes
    rows = np.asarray(raw, dtype=np.float32)
    if rows.ndim == 2 and rows.shape[1] != width and rows.shape[0] == width:
        rows = rows.T  # exported as [4 + C, N] (YOLOv8's [84, 8400])
    if rows.ndim != 2 or rows.shape[1] != width:
        raise ValueError(
            f"a YOLO-style output for {num_classes} classes must be [N, {width}] "
            f"or [{width}, N], got {list(rows.shape)}"
        )
    boxes = corners(rows[:, :4], box_format)
    if normalized:
        boxes = boxes * np.asarray(input_size * 2, dtype=np.float32)
    scores = activate(rows[:, extra:], activation)
    if objectness:
        scores = scores * activate(rows[:, 4:5], activation)
    return boxes, scores


def ssd_candidates(
    loc: np.ndarray,
    conf: np.ndarray,
    anchors: np.ndarray,
    input_size: tuple[int, int],
    *,
    variances: tuple[float, float],
    activation: ScoreActivation,
    background: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """SSD regressions against anchors (cx, cy, w, h, normalised to the input) → corner boxes
    in input pixels [A, 4] and class scores [A, C]."""
    loc = np.asarray(loc, dtype=np.float32).reshape(-1, 4)
    conf = np.asarray(conf, dtype=np.float32).reshape(len(loc), -1)
    if anchors.shape != loc.shape:
        raise ValueError(f"{len(anchors)} anchors for {len(loc)} box regressions")
    centre_var, size_var = variances
    cxcy = anchors[:, :2] + loc[:, :2] * centre_var * anchors[:, 2:]
    wh = anchors[:, 2:] * np.exp(np.clip(loc[:, 2:] * size_var, -10.0, 10.0))
    boxes = corners(np.concatenate([cxcy, wh], axis=1), "cxcywh")
    boxes = boxes * np.asarray(input_size * 2, dtype=np.float32)
    scores = activate(conf, activation)
    if background:
        scores = scores[:, 1:]
    return boxes, scores


def postprocessed_detections(
    outputs: list[np.ndarray],
    input_size: tuple[int, int],
    geometry: Geometry,
    *,
    box_format: BoxFormat,
    normalized: bool,
    first_class_id: int,
    score_threshold: float,
    max_detections: int,
) -> Detections:
    """A graph's own NMS output (boxes, classes, scores[, count]) → kept detections.

    The graph pads to a fixed row count (TF: 100) with zero scores; ``count`` says how many rows
    are real. Class ids become label indices by subtracting ``first_class_id``; a row whose id
    falls below it (TF's background 0) or whose box is not finite is dropped, never indexed.
    """
    if len(outputs) not in (3, 4):
        raise ValueError(
            f"a post-processed head reads boxes, classes, scores[, count]: got {len(outputs)}"
        )
    boxes = np.asarray(outputs[0], dtype=np.float32).reshape(-1, 4)
    classes = np.asarray(outputs[1], dtype=np.float64).reshape(-1)
    scores = np.asarray(outputs[2], dtype=np.float32).reshape(-1)
    if not len(boxes) == len(classes) == len(scores):
        raise ValueError(
            f"post-processed outputs disagree on the row count: boxes {len(boxes)}, "
            f"classes {len(classes)}, scores {len(scores)}"
        )
    rows = len(scores)
    if len(outputs) == 4:
        count = np.asarray(outputs[3], dtype=np.float64).reshape(-1)
        if count.size and np.isfinite(count[0]):
            rows = int(np.clip(count[0], 0, rows))
    boxes, classes, scores = boxes[:rows], classes[:rows], scores[:rows]
    index = np.rint(classes).astype(np.int64) - first_class_id
    valid = (
        (scores >= score_threshold)
        & (index >= 0)
        & np.isfinite(scores)
        & np.isfinite(boxes).all(axis=1)
    )
    boxes, scores, index = boxes[valid], scores[valid], index[valid]
    order = np.argsort(-scores, kind="stable")[:max_detections]
    corner = corners(boxes[order], box_format)
    if normalized:
        corner = corner * np.asarray(input_size * 2, dtype=np.float32)
    return Detections(to_original(corner, geometry), scores[order].astype(np.float32), index[order])


def select(
    boxes: np.ndarray,
    scores: np.ndarray,
    geometry: Geometry,
    *,
    score_threshold: float,
    iou_threshold: float,
    max_detections: int,
) -> Detections:
    """Each candidate's best class, the threshold, per-class NMS, and the boxes mapped back
    through ``geometry`` to the original image."""
    best = scores.argmax(axis=1) if scores.size else np.zeros(0, dtype=np.int64)
    confidence = scores[np.arange(len(best)), best] if scores.size else scores.reshape(0)
    passed = confidence >= score_threshold
    boxes, confidence, best = boxes[passed], confidence[passed], best[passed]
    kept = nms(boxes, confidence, best, iou_threshold, max_detections)
    return Detections(
        to_original(boxes[kept], geometry),
        confidence[kept].astype(np.float32),
        best[kept].astype(np.int64),
    )
