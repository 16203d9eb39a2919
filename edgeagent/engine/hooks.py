"""Data-plane hooks: who else sees an answered image request (capture, MLServer-style).

The data plane calls each hook after it answered a ``/classify`` or ``/detect`` request, on
the event loop, with the image bytes as received and the answer as returned — or after a
camera's frame or a Frigate zmq request went through a model, with the decoded frame itself
(encoding every frame on the chance a hook keeps it would cost the request path; a hook that
keeps one encodes it, off the loop). A hook must not
block or raise into the request: it is handed a finished event and decides on its own (the
capture hook checks its rules and enqueues or drops). A hook that raises is logged once per
model and the request is answered all the same. Requests the agent makes for itself (the
capture's redaction detector) carry ``internal`` and see no hook.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

from edgeagent.models.capture_table import CaptureHints

if TYPE_CHECKING:
    import numpy as np
    from PIL import Image

log = logging.getLogger(__name__)

# An uploaded image's bytes; a camera's decoded frame; Frigate's RGB pixels (H × W × 3 uint8).
Frame: TypeAlias = "bytes | Image.Image | np.ndarray"


@dataclass(frozen=True)
class InferenceEvent:
    """One answered image request: what came in and what the model said."""

    model: str
    version: str
    task: str  # classification | detection
    variant: str  # runtime/precision@device that computed the answer
    image: Frame  # the request's body as the client sent it, or the decoded frame
    answer: dict[str, Any]  # the JSON the client got (labels/scores or detections)
    capture: CaptureHints = field(default_factory=CaptureHints)  # the package's [capture]
    at: float = field(default_factory=time.time)  # wall clock, for the sample's record

    @property
    def confidence(self) -> float:
        """The top score: a classifier's first score, a detector's best box (0 = none)."""
        if self.task == "classification":
            scores = self.answer.get("scores") or [0.0]
            return float(scores[0])
        found = self.answer.get("detections") or []
        return max((float(d.get("score", 0.0)) for d in found), default=0.0)

    @property
    def labels(self) -> list[str]:
        """The top label (classifier) or every box's label (detector)."""
        if self.task == "classification":
            return list(self.answer.get("labels", [])[:1])
        return [str(d.get("label", "")) for d in self.answer.get("detections") or []]


InferenceHook = Callable[[InferenceEvent], None]


class Hooks:
    """The hooks a data plane calls; a raising hook is logged and never fails the request."""

    def __init__(self) -> None:
        self._hooks: list[InferenceHook] = []
        self._complained: set[tuple[int, str]] = set()

    def add(self, hook: InferenceHook) -> None:
        self._hooks.append(hook)

    def __bool__(self) -> bool:
        return bool(self._hooks)

    def notify(self, event: InferenceEvent) -> None:
        for hook in self._hooks:
            try:
                hook(event)
            except Exception:
                key = (id(hook), event.model)
                if key not in self._complained:
                    self._complained.add(key)
                    log.exception("inference hook %r failed for model %s", hook, event.model)
