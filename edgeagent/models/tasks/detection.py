"""Object detection: raw head outputs → boxes in the original image's pixels.

The pieces live by what they need: the ``[detection]`` table's parsed form
(:class:`DetectionHead`, no numpy, so reading a package stays light) in
``models.detection_head``; the numeric decoder (candidates, NMS, mapping back) in
``models.tasks.decode``. This module is where callers find them together, with the geometry of
each preprocessing (stretch, shorter-side resize + centre crop, or letterbox) and the
generator of SSD anchors.
"""

from __future__ import annotations

import numpy as np

from edgeagent.models.detection_head import DetectionHead
from edgeagent.models.tasks.decode import (
    Detections,
    Geometry,
    iou_matrix,
    nms,
    to_original,
)

__all__ = [
    "DetectionHead",
    "Detections",
    "Geometry",
    "crop_geometry",
    "iou_matrix",
    "letterbox_geometry",
    "nms",
    "ssd_anchors",
    "stretch_geometry",
    "to_original",
]


def stretch_geometry(original: tuple[int, int], model: tuple[int, int]) -> Geometry:
    """Plain resize to the model's (width, height)."""
    (width, height), (model_w, model_h) = original, model
    return Geometry((model_w / width, model_h / height), (0.0, 0.0), original)


def crop_geometry(original: tuple[int, int], model: tuple[int, int], shorter: int) -> Geometry:
    """Shorter side to ``shorter`` then a centre crop of the model's size (as classifiers do)."""
    (width, height), (model_w, model_h) = original, model
    scale = shorter / min(width, height)
    resized_w = max(model_w, round(width * scale))
    resized_h = max(model_h, round(height * scale))
    left, top = (resized_w - model_w) // 2, (resized_h - model_h) // 2
    return Geometry((resized_w / width, resized_h / height), (-float(left), -float(top)), original)


def letterbox_geometry(original: tuple[int, int], model: tuple[int, int]) -> Geometry:
    """Scale to fit inside the model's size keeping the aspect ratio, pad the rest evenly."""
    (width, height), (model_w, model_h) = original, model
    scale = min(model_w / width, model_h / height)
    pad_x = (model_w - round(width * scale)) // 2
    pad_y = (model_h - round(height * scale)) // 2
    return Geometry((scale, scale), (float(pad_x), float(pad_y)), original)


def ssd_anchors(
    feature_maps: list[int],
    scales: list[float],
    aspect_ratios: tuple[float, ...] = (1.0, 2.0, 0.5),
) -> np.ndarray:
    """SSD anchors (cx, cy, w, h in 0..1) for square feature maps, one scale per map.

    Each cell of a ``k × k`` map gets one anchor per aspect ratio at that map's scale plus one
    at the geometric mean of this scale and the next, as in the SSD paper; anchors are ordered
    map by map, row-major over cells, all shapes of a cell together (as heads emit them).
    """
    if len(scales) != len(feature_maps) + 1:
        raise ValueError("give one scale per feature map plus one for the last map's extra box")
    per_map = []
    for index, size in enumerate(feature_maps):
        centres = (np.arange(size, dtype=np.float32) + 0.5) / size
        cy, cx = np.meshgrid(centres, centres, indexing="ij")
        scale, following = scales[index], scales[index + 1]
        shapes = [(scale * np.sqrt(r), scale / np.sqrt(r)) for r in aspect_ratios]
        shapes.append((float(np.sqrt(scale * following)),) * 2)
        grid = np.empty((size * size, len(shapes), 4), dtype=np.float32)
        grid[:, :, 0] = cx.reshape(-1, 1)
        grid[:, :, 1] = cy.reshape(-1, 1)
        grid[:, :, 2:] = np.asarray(shapes, dtype=np.float32)[None]
        per_map.append(grid.reshape(-1, 4))
    return np.concatenate(per_map)
