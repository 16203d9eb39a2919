"""What a model file says about itself beyond its tensors, applied to the build's options.

A flag always wins; where none is given the file's own words fill the gap before anything is
refused: the image size an Ultralytics export records (``imgsz``), the class names it or a
PaddleOCR or TFLite file carries (``labels_meta``), and the detector its outputs make
(``detector_graph``), which sets the task, the letterbox and the ``[detection]`` head.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from edgeagent.models.package import Preprocess
from edgeagent.packaging.detector_graph import Recognised, recognise
from edgeagent.packaging.labels_meta import image_size_from_metadata, model_labels, onnx_metadata
from edgeagent.packaging.options import LogicalModel, PackageOptions
from edgeagent.packaging.sources import SourceModel
from edgeagent.packaging.task_checks import Head
from edgeagent.packaging.variants import Progress


@dataclass(frozen=True)
class SelfDescribed:
    options: PackageOptions  # the flags, with the file's image size and task filled in
    names: tuple[str, ...] | None  # class names from the file (None: none, or --labels given)
    detector: Recognised | None


def read_self(reference: SourceModel, options: PackageOptions, progress: Progress) -> SelfDescribed:
    """The flags completed from the reference file's metadata and output shapes."""
    meta = onnx_metadata(reference.path)
    image = reference.inputs[0].shape
    layout = options.layout or reference.layout
    spatial = (2, 3) if layout == "NCHW" else (1, 2)
    if options.input_size is None and len(image) == 4 and layout is not None:
        native = (image[spatial[0]], image[spatial[1]])
        recorded = image_size_from_metadata(meta)
        if None in native and recorded is not None:
            progress(f"input size {recorded[0]}×{recorded[1]} from the model's metadata (imgsz)")
            options = replace(options, input_size=recorded)
    names = None if options.labels is not None else model_labels(reference.path, meta)
    known = _label_lines(options.labels) if options.labels is not None else names
    detector = None
    size = options.input_size or (
        (image[spatial[0]], image[spatial[1]]) if len(image) == 4 and layout else (None, None)
    )
    if size[0] and size[1] and options.task in (None, "detection"):
        outputs = [t.shape for t in reference.outputs]
        detector = recognise(outputs, (int(size[0]), int(size[1])), meta, known)
    if detector is not None:
        progress(f"detector recognised: {detector.what}")
        if options.task is None:
            options = replace(options, task="detection")
    if names is not None:
        progress(f"{len(names)} class names from the model's own metadata")
    return SelfDescribed(options, names, detector)


def _label_lines(path: Path) -> tuple[str, ...]:
    if not path.is_file():
        return ()
    lines = path.read_text(encoding="utf-8").splitlines()
    return tuple(line.strip() for line in lines if line.strip())


def letterboxed(
    preprocess: Preprocess | None, found: SelfDescribed, options: PackageOptions
) -> Preprocess | None:
    """The exporter's letterbox (centred, grey 114) for a YOLO-family detector, unless
    ``--crop`` asked for a centre crop instead."""
    detector = found.detector
    if preprocess is None or detector is None or not detector.letterbox or options.crop:
        return preprocess
    return replace(preprocess, letterbox=True, resize=None)


def head_of(found: SelfDescribed, logical: LogicalModel) -> Head | None:
    """The head the package declares, with the input size decoding needs (None: none)."""
    detector = found.detector
    if detector is None or detector.head is None or logical.task != "detection":
        return None
    shape = logical.inputs[0].shape
    height, width = (shape[2], shape[3]) if logical.layout == "NCHW" else (shape[1], shape[2])
    return Head(detector.head, (width, height), detector.classes)


def fixed_outputs(logical: LogicalModel, measured: Mapping[str, np.ndarray]) -> LogicalModel:
    """Output dimensions the file left open, as the reference answered them (batch open).

    A detector's class count is read from its output's shape when it has no labels; a shape
    recorded as ``[-1, 22, -1]`` would read as one class.
    """
    outputs = tuple(
        replace(t, shape=(-1, *(int(d) for d in measured[t.name].shape[1:])))
        if t.name in measured and measured[t.name].ndim == len(t.shape)
        else t
        for t in logical.outputs
    )
    return replace(logical, outputs=outputs)
