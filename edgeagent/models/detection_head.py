"""A detector's ``[detection]`` table in its parsed form: how to read the model's outputs.

The package reader builds it and the hub, the packager and the updater carry it around without
decoding anything, so it holds plain fields and imports no numpy. Decoding is the one place it
needs the numeric code (``models.tasks.decode``): :meth:`DetectionHead.decode` imports it then,
which keeps numpy out of every process that only reads, writes or signs packages.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from edgeagent.models.names import BoxFormat, HeadStyle, ScoreActivation

if TYPE_CHECKING:
    import numpy as np

    from edgeagent.models.tasks.decode import Detections, Geometry

# The lowest score threshold a request may ask for. Below it a YOLO head's thousands of
# near-zero candidates would all be scored and sent to NMS (decode caps it at 2000), and no
# client wants boxes it is 99 % sure are not there.
DECODE_FLOOR = 0.01


@dataclass(frozen=True)
class DetectionHead:
    """How to read one detector's outputs (the ``[detection]`` table of model.toml)."""

    style: HeadStyle = "yolo"
    box_format: BoxFormat = "cxcywh"
    normalized: bool = False  # box coordinates in 0..1 of the input rather than input pixels
    objectness: bool = False  # YOLOv5-style [N, 5 + C]: an objectness column before the classes
    activation: ScoreActivation = "none"  # applied to the class scores (and objectness)
    background: bool = False  # SSD softmax: column 0 is "background", not a class
    variances: tuple[float, float] = (0.1, 0.2)  # SSD: centre and size regression scales
    first_class_id: int = 0  # post-processed: the class id of labels.txt's first line (TF: 1)
    score_threshold: float = 0.25
    iou_threshold: float = 0.45
    max_detections: int = 100

    def threshold_for(self, min_score: float | None) -> float:
        """The score threshold of one request: the package's, or the request's own, never
        below ``DECODE_FLOOR``.

        A request may lower it too: Home Assistant always sends ``min_confidence=0.1`` and
        expects boxes down to 0.1, which taking the higher of the two never gave it."""
        return self.score_threshold if min_score is None else max(DECODE_FLOOR, min_score)

    def decode(
        self,
        outputs: list[np.ndarray],
        input_size: tuple[int, int],
        geometry: Geometry,
        num_classes: int,
        anchors: np.ndarray | None = None,
        min_score: float | None = None,
    ) -> Detections:
        """One image's outputs (batch dimension removed) → detections in original pixels.

        ``input_size`` is the model's (width, height); ``num_classes`` tells a ``[4 + C, N]``
        export from ``[N, 4 + C]``; ``min_score`` is one request's threshold in place of the
        package's (DeepStack's ``min_confidence``; see ``threshold_for``).
        """
        from edgeagent.models.tasks import decode  # numpy: needed only to decode

        if self.style == "postprocessed":  # NMS ran in the graph: nothing to re-score
            return decode.postprocessed_detections(
                outputs,
                input_size,
                geometry,
                box_format=self.box_format,
                normalized=self.normalized,
                first_class_id=self.first_class_id,
                score_threshold=self.threshold_for(min_score),
                max_detections=self.max_detections,
            )
        if self.style == "yolo":
            boxes, scores = decode.yolo_candidates(
                outputs[0],
                input_size,
                num_classes,
                box_format=self.box_format,
                normalized=self.normalized,
                objectness=self.objectness,
                activation=self.activation,
            )
        else:
            if anchors is None:
                raise ValueError("an SSD-style head needs its anchors")
            boxes, scores = decode.ssd_candidates(
                outputs[0],
                outputs[1],
                anchors,
                input_size,
                variances=self.variances,
                activation=self.activation,
                background=self.background,
            )
        return decode.select(
            boxes,
            scores,
            geometry,
            score_threshold=self.threshold_for(min_score),
            iou_threshold=self.iou_threshold,
            max_detections=self.max_detections,
        )
