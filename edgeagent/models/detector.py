"""A detector package's outputs → detections, with the package's own ``[detection]`` head.

The serving path (boxes mapped to the caller's image) and the golden check (boxes in
model-input pixels, for every row of a batch) decode the same way; what they share about the
package — its input size and how many classes it scores — lives here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from edgeagent.models.package import ModelPackage
from edgeagent.models.tasks.detection import Detections, Geometry


def class_count(package: ModelPackage) -> int:
    """How many classes a detector scores: its labels, else what its score output says."""
    if package.labels:
        return len(package.labels)
    assert package.detection is not None
    if package.detection.style == "ssd":
        return max(1, package.outputs[-1].shape[-1] - int(package.detection.background))
    rows = min(package.outputs[0].shape[-2:])  # [N, 4 + C] or its transpose [4 + C, N]
    return max(1, rows - (5 if package.detection.objectness else 4))


def input_size(package: ModelPackage) -> tuple[int, int]:
    """The model's input (width, height), from its preprocessing."""
    assert package.preprocess is not None
    height, width = package.preprocess.size
    return width, height


def decode_row(
    package: ModelPackage,
    outputs: list[np.ndarray],
    geometry: Geometry,
    min_score: float | None = None,
) -> Detections:
    """One image's outputs (batch dimension removed) → detections in ``geometry``'s pixels."""
    assert package.detection is not None
    return package.detection.decode(
        outputs, input_size(package), geometry, class_count(package), package.anchors, min_score
    )


def detections_json(package: ModelPackage, found: Detections) -> list[dict[str, Any]]:
    """Detections as every answer shows them (the /detect route, ``edgeagent infer``): label,
    class index, score and box in the image's pixels, best first."""
    labels = package.labels
    return [
        {
            "label": labels[c] if c < len(labels) else str(c),
            "index": int(c),
            "score": round(float(s), 6),
            "box": [round(float(v), 2) for v in box],
        }
        for box, s, c in zip(found.boxes, found.scores, found.classes, strict=True)
    ]


def decode_batch(package: ModelPackage, outputs: Mapping[str, np.ndarray]) -> list[Detections]:
    """Every row of a batch → detections in model-input pixels (what golden records hold)."""
    size = input_size(package)
    identity = Geometry((1.0, 1.0), (0.0, 0.0), size)
    arrays = [np.asarray(outputs[spec.name]) for spec in package.outputs]
    rows = range(len(arrays[0]))
    return [decode_row(package, [a[row] for a in arrays], identity) for row in rows]
