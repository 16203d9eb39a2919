"""A detector package's ``[detection]`` table: the head's style, box format and thresholds,
and the anchors of an SSD-style head (a ``.npy`` file in the package, or generated from
``[detection.anchors]``).

Apart from the package reader because it is the one table that reads an array (numpy is
imported only for an SSD head) and the one whose checks depend on the declared outputs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from edgeagent.models.detection_head import DetectionHead
from edgeagent.models.toml_fields import Fields, floats, inside

if TYPE_CHECKING:
    import numpy as np


def read_detection(
    root: Path, manifest: Path, table: dict, outputs: Sequence[object]
) -> tuple[DetectionHead, np.ndarray | None]:
    """The ``[detection]`` table: head style, thresholds, and the anchors of an SSD-style head
    (a ``.npy`` file in the package, or ``[detection.anchors]`` to generate them)."""
    fields = Fields(manifest, "detection", table)
    fields.unknown(
        {
            "style",
            "box_format",
            "normalized",
            "objectness",
            "activation",
            "background",
            "variances",
            "first_class_id",
            "score_threshold",
            "iou_threshold",
            "max_detections",
            "anchors",
        }
    )
    variances = floats(fields, "variances", (0.1, 0.2))
    if len(variances) != 2 or min(variances) <= 0:
        fields.fail("must be two positive numbers [centre, size]", "variances")
    head = DetectionHead(
        style=fields.get("style", str, "yolo", choices=("yolo", "ssd", "postprocessed")),
        box_format=fields.get("box_format", str, "cxcywh", choices=("cxcywh", "xyxy", "yxyx")),
        normalized=fields.get("normalized", bool, False),
        objectness=fields.get("objectness", bool, False),
        activation=fields.get("activation", str, "none", choices=("none", "sigmoid", "softmax")),
        background=fields.get("background", bool, False),
        variances=(variances[0], variances[1]),
        first_class_id=fields.get("first_class_id", int, 0),
        score_threshold=float(fields.get("score_threshold", (int, float), 0.25)),
        iou_threshold=float(fields.get("iou_threshold", (int, float), 0.45)),
        max_detections=fields.get("max_detections", int, 100),
    )
    for key in ("score_threshold", "iou_threshold"):
        if not 0 <= getattr(head, key) <= 1:
            fields.fail("must be between 0 and 1", key)
    if not 1 <= head.max_detections <= 10_000:
        fields.fail("must be 1..10000", "max_detections")
    if not 0 <= head.first_class_id <= 1:
        fields.fail("must be 0 or 1 (the class id of the first label)", "first_class_id")
    wanted = {"ssd": (2,), "postprocessed": (3, 4)}.get(head.style, (1,))
    if len(outputs) not in wanted:
        fields.fail(
            f"a {head.style}-style head has {' or '.join(map(str, wanted))} output(s), the "
            f"package declares {len(outputs)}",
            "style",
        )
    if head.style != "ssd":
        if "anchors" in fields.table:
            kind = "YOLO" if head.style == "yolo" else head.style
            fields.fail(f"a {kind}-style head has no anchors", "anchors")
        return head, None
    return head, _anchors(root, manifest, fields)


def _anchors(root: Path, manifest: Path, fields: Fields) -> np.ndarray:
    # numpy is read here only: the rest of the reader (what the hub runs to sign a release)
    # works on plain values, and only an SSD head carries an array.
    import numpy as np

    from edgeagent.models.tasks.detection import ssd_anchors

    value = fields.get("anchors", (str, dict))
    if isinstance(value, str):
        path = inside(root, manifest, "detection.anchors", value)
        try:
            anchors = np.load(path, allow_pickle=False)
        except (OSError, ValueError) as exc:
            fields.fail(f"cannot read {value!r} as a .npy array: {exc}", "anchors")
    else:
        generator = Fields(manifest, "detection.anchors", value)
        generator.unknown({"feature_maps", "scales", "aspect_ratios"})
        maps = generator.get("feature_maps", list)
        if not maps or not all(isinstance(m, int) and 0 < m <= 1024 for m in maps):
            generator.fail("must be a list of feature-map sizes (1..1024)", "feature_maps")
        scales = floats(generator, "scales", ())
        ratios = floats(generator, "aspect_ratios", (1.0, 2.0, 0.5))
        try:
            anchors = ssd_anchors(maps, list(scales), ratios)
        except ValueError as exc:
            generator.fail(str(exc), "scales")
    if anchors.ndim != 2 or anchors.shape[1] != 4 or not np.all(np.isfinite(anchors)):
        fields.fail(
            f"anchors must be a finite [A, 4] array (cx, cy, w, h), got {anchors.shape}", "anchors"
        )
    return anchors.astype(np.float32)
