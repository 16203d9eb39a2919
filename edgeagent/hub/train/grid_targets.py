"""Which output rows of a grid detector should find each reviewed box, and the loss that says so.

The rows of an anchor-free grid head (``[N, rows, 4 + C]``: centre-x, centre-y, width, height
normalised to the input, then class scores) each belong to one cell. The cell is read from the
decode itself: the row a zero map decodes to has its box centred on its cell, for the grid
decodes this trainer accepts (``cell + sigmoid·k − k/2``, YOLOv5/v8 and the zoo's alike). Each
reviewed box is then assigned to the 3×3 cells around its centre with a soft score target that
falls off with the distance from the centre (a Gaussian of ``SIGMA`` cells), as the zoo's
detector was trained; a cell claimed by two boxes goes to the nearer centre.

The loss is the zoo's: quality focal loss (GFL) on the scores, L1 and generalised IoU on the
boxes of assigned rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np

SIGMA = 0.8  # cells
REACH = 1.5  # cells either side of a box's centre whose rows are assigned to it (3×3)
BOX_L1_WEIGHT = 5.0
BOX_GIOU_WEIGHT = 2.0


class GridError(ValueError):
    pass


def grid_of(centres: np.ndarray) -> tuple[float, float]:
    """The cell size (x, y, normalised) of rows centred at ``centres`` ``[rows, 2]``.

    Refused unless the rows form one regular grid: a multi-scale head (strides 8, 16 and 32
    in one output) needs its rows assigned per scale, which this trainer does not do."""
    xs, ys = np.unique(centres[:, 0].round(6)), np.unique(centres[:, 1].round(6))
    if len(xs) < 2 or len(ys) < 2 or len(xs) * len(ys) != len(centres):
        raise GridError(
            f"the {len(centres)} output rows do not form one grid ({len(xs)}×{len(ys)} centres): "
            "a multi-scale or anchor-based head is not fine-tuned here"
        )
    return float(np.median(np.diff(xs))), float(np.median(np.diff(ys)))


def assign(
    boxes: list[np.ndarray], labels: list[np.ndarray], centres: np.ndarray, classes: int
) -> tuple[np.ndarray, np.ndarray]:
    """Score targets ``[N, rows, C]`` and box targets ``[N, rows, 4]`` (normalised centre-size).

    ``boxes[i]`` holds image i's corner boxes normalised to the input, ``labels[i]`` their
    classes."""
    cell = np.asarray(grid_of(centres), np.float32)
    scores = np.zeros((len(boxes), len(centres), classes), np.float32)
    targets = np.zeros((len(boxes), len(centres), 4), np.float32)
    for image, (image_boxes, image_labels) in enumerate(zip(boxes, labels, strict=True)):
        best = np.zeros(len(centres), np.float32)
        for box, label in zip(image_boxes, image_labels, strict=True):
            centre = (box[:2] + box[2:]) / 2
            distance = (centres - centre) / cell  # in cells, per axis
            near = np.all(np.abs(distance) < REACH, axis=1)
            weight = np.where(near, np.exp(-(distance**2).sum(axis=1) / (2 * SIGMA**2)), 0.0)
            claim = weight > best
            best = np.where(claim, weight, best)
            scores[image, claim] = 0.0
            scores[image, claim, int(label)] = weight[claim]
            targets[image, claim] = np.concatenate([centre, box[2:] - box[:2]])
    return scores, targets


def _corners(rows: Any) -> Any:
    import torch

    centre, extent = rows[:, :2], rows[:, 2:]
    return torch.cat([centre - extent / 2, centre + extent / 2], dim=1)


def giou_loss(predicted: Any, target: Any) -> Any:
    """1 − generalised IoU of ``[K, 4]`` centre-size boxes, per row."""
    import torch

    a, b = _corners(predicted), _corners(target)
    inter = (torch.minimum(a[:, 2:], b[:, 2:]) - torch.maximum(a[:, :2], b[:, :2])).clamp(min=0)
    inter_area = inter.prod(dim=1)
    union = predicted[:, 2:].prod(dim=1) + target[:, 2:].prod(dim=1) - inter_area
    hull = (torch.maximum(a[:, 2:], b[:, 2:]) - torch.minimum(a[:, :2], b[:, :2])).prod(dim=1)
    iou = inter_area / union.clamp(min=1e-9)
    return 1 - iou + (hull - union) / hull.clamp(min=1e-9)


def row_loss(rows: Any, scores: Any, boxes: Any) -> Any:
    """Quality focal loss on decoded rows' scores (already probabilities) + weighted L1 and
    GIoU on the rows a box is assigned to, normalised by the assigned weight."""
    import torch

    probability = rows[..., 4:].clamp(1e-6, 1 - 1e-6)
    bce = torch.nn.functional.binary_cross_entropy(probability, scores, reduction="none")
    focal = ((probability - scores).abs() ** 2 * bce).sum()
    weight = scores.amax(dim=-1)
    positive = weight > 0
    total = weight[positive].sum().clamp(min=1.0)
    decoded, wanted, cell_weight = rows[..., :4][positive], boxes[positive], weight[positive]
    l1 = ((decoded - wanted).abs().sum(dim=1) * cell_weight).sum()
    giou = (giou_loss(decoded, wanted) * cell_weight).sum()
    return (focal + BOX_L1_WEIGHT * l1 + BOX_GIOU_WEIGHT * giou) / total
