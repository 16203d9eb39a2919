"""Which detector a graph is, read from the shapes of its outputs, so ``/detect`` needs no edit.

The families edge users bring, and what gives each away:

- **YOLOv8 / YOLO11** (Ultralytics): one output ``[1, 4 + C, N]`` (or its transpose), boxes as
  centre + size in input pixels, class scores already through a sigmoid, no objectness. ``N``
  is the anchor-free grid: one cell per stride 8, 16, 32 (and 64 for P6 models) of the input.
- **YOLOv5**: one output ``[1, N, 5 + C]`` with an objectness column, ``N`` three anchors per
  cell of the same grid.
- **YOLOX**: ``[1, N, 5 + C]`` rows first at the *anchor-free* count (one per cell), with an
  objectness column, centres relative to their cell and log sizes. Its row count at 416 equals
  YOLOv8's, so rows first without Ultralytics' metadata are taken for YOLOX, not decoded as
  YOLOv8 boxes: recognised and said so, packaged as tensors.
- **NMS in the graph** (Ultralytics ``nms=True``, end-to-end exports): ``[1, K, 6]`` rows of
  corners, score and class; **SSD-style post-processed** (the TF Object Detection API's boxes,
  classes, scores, count), which get the ``postprocessed`` head (threshold and mapping back,
  no second NMS). YOLO rows already decided are recognised and served as tensors, said so.

The grid count is what makes the guess safe: a ``[1, 84, 8400]`` tensor is a YOLOv8 head only
if 8400 cells are what a 640×640 input gives at those strides. Ultralytics exports pad images
centred with grey 114 (``letterbox``), which the agent's preprocessing does the same way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from edgeagent.models.detection_head import DetectionHead
from edgeagent.packaging.errors import PackagingError

STRIDE_SETS = ((8, 16, 32), (8, 16, 32, 64))  # P3-P5 (the usual), P3-P6 (the "6" models)
YOLOV5_ANCHORS_PER_CELL = 3
# The TF Object Detection API's convention: boxes ymin, xmin, ymax, xmax in 0..1, class ids
# from 1 (0 is background), so labels.txt's first line names id 1.
POSTPROCESSED_HEAD = DetectionHead(
    style="postprocessed", box_format="yxyx", normalized=True, first_class_id=1
)
MAX_DECODED_ROWS = 1000  # a [1, K, 6|7] output with K at most this is rows NMS already chose


@dataclass(frozen=True)
class Recognised:
    """A detector recognised from its outputs: its head (None: boxes decided in the graph),
    its class count and whether its images are letterboxed."""

    head: DetectionHead | None
    classes: int
    letterbox: bool
    what: str  # one line for the build's progress and the docs


def _cells(size: int, stride: int) -> int:
    """Feature-map length at ``stride``: each stride-2 convolution rounds up."""
    for _ in range(stride.bit_length() - 1):
        size = (size + 1) // 2
    return size


def grid_counts(height: int, width: int, per_cell: int = 1) -> set[int]:
    """Candidate counts a YOLO head has for an input, one per stride set."""
    return {
        per_cell * sum(_cells(height, s) * _cells(width, s) for s in strides)
        for strides in STRIDE_SETS
    }


def recognise(
    outputs: Sequence[tuple[int | None, ...]],
    input_hw: tuple[int, int],
    meta: Mapping[str, str],
    names: Sequence[str] | None,
) -> Recognised | None:
    """The detector ``outputs`` (shapes, batch first, None = open) make, or None.

    ``names`` are the class names known (flag or metadata); a head whose class count differs
    from them is refused rather than served with the wrong names.
    """
    height, width = input_hw
    ultralytics = meta.get("author", "").lower() == "ultralytics" or meta.get("task") == "detect"
    found = _one_output(outputs, height, width, ultralytics) if len(outputs) == 1 else None
    if found is None and _postprocessed_ssd(outputs):
        # In the order the "postprocessed" head reads them (TFLite's, tf2onnx's for the OD API)
        # they get a [detection] table; in any other order classes and scores cannot be told
        # apart by shape, so they stay tensors.
        ordered = [len(s) for s in outputs] == [3, 2, 2, 1]
        return Recognised(
            POSTPROCESSED_HEAD if ordered else None,
            len(names) if names else 0,
            False,
            "SSD-style post-processed outputs (boxes, classes, scores, count, NMS in the graph)"
            + ("" if ordered else ", not in that order: served as tensors"),
        )
    if found is None:
        return None
    if names and found.head is not None and len(names) != found.classes:
        raise PackagingError(
            f"{len(names)} class names, but the detector's output scores {found.classes} "
            f"classes: pass --labels with one name per class"
        )
    return found


def _one_output(
    outputs: Sequence[tuple[int | None, ...]], height: int, width: int, ultralytics: bool
) -> Recognised | None:
    shape = outputs[0]
    if len(shape) != 3:
        return None
    rows, cols = shape[1], shape[2]
    anchor_free = grid_counts(height, width)
    anchored = grid_counts(height, width, YOLOV5_ANCHORS_PER_CELL)
    # Ultralytics' own predict defaults: conf 0.25, class-aware NMS at IoU 0.7, 300 boxes.
    v8 = DetectionHead(style="yolo", box_format="cxcywh", iou_threshold=0.7, max_detections=300)
    # [1, 4 + C, N]: the usual Ultralytics export (N open when the export left the size open).
    if rows is not None and rows > 4 and (cols in anchor_free or (cols is None and ultralytics)):
        return Recognised(v8, rows - 4, True, f"YOLOv8-style head [4 + {rows - 4}, N]")
    if cols is not None and cols > 5 and rows in anchor_free and not ultralytics:
        # Rows first at the anchor-free count: what YOLOX exports (objectness, centres
        # relative to their grid cell, log sizes). Ultralytics writes [4 + C, N] and says so in
        # its metadata; without that the rows are not decoded as YOLOv8's pixel boxes.
        return Recognised(
            None,
            cols - 5,
            False,
            f"YOLOX-style rows [N, 5 + {cols - 5}] (objectness, grid-relative centres, log "
            "sizes), which /detect does not decode",
        )
    if cols is not None and cols > 4 and rows in anchor_free:
        return Recognised(v8, cols - 4, True, f"YOLOv8-style head [N, 4 + {cols - 4}]")
    if cols is not None and cols > 5 and rows in anchored:
        v5 = DetectionHead(style="yolo", box_format="cxcywh", objectness=True)  # detect.py's 0.45
        return Recognised(v5, cols - 5, True, f"YOLOv5-style head [N, 5 + {cols - 5}]")
    if cols in (6, 7) and rows is not None and rows <= MAX_DECODED_ROWS:
        return Recognised(
            None, 0, ultralytics, f"YOLO rows with NMS in the graph [{rows}, {cols}]: as tensors"
        )
    return None


def _postprocessed_ssd(outputs: Sequence[tuple[int | None, ...]]) -> bool:
    """The TF Object Detection API's four outputs: boxes [1, K, 4], two [1, K], count [1]."""
    if len(outputs) != 4:
        return False
    ranks = sorted(len(s) for s in outputs)
    boxes = [s for s in outputs if len(s) == 3]
    return ranks == [1, 2, 2, 3] and len(boxes) == 1 and boxes[0][2] == 4
