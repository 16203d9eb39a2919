"""What a model file says about itself beyond its tensors, applied to the build's options.

A flag always wins; where none is given the file's own words fill the gap before anything is
refused: the image size an Ultralytics export records (``imgsz``), the class names it or a
PaddleOCR or TFLite file carries (``labels_meta``), and the detector its outputs make
(``detector_graph``), which sets the task, the letterbox and the ``[detection]`` head — or, with
``--head-from``, the head a detector package already declares.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from edgeagent.models.package import Preprocess
from edgeagent.packaging.detector_graph import Recognised, recognise
from edgeagent.packaging.errors import PackagingError
from edgeagent.packaging.labels_meta import (
    image_size_from_metadata,
    model_labels,
    onnx_metadata,
    resize_filter_from_metadata,
)
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
    recorded_filter = resize_filter_from_metadata(meta)
    if options.resize_filter is None and recorded_filter is not None:
        progress(f"resize filter {recorded_filter} from the model's metadata")
        options = replace(options, resize_filter=recorded_filter)
    names = None if options.labels is not None else model_labels(reference.path, meta)
    known = _label_lines(options.labels) if options.labels is not None else names
    detector = None
    size = options.input_size or (
        (image[spatial[0]], image[spatial[1]]) if len(image) == 4 and layout else (None, None)
    )
    if options.head_from is not None:
        detector = head_from(options.head_from, [t.shape for t in reference.outputs])
        options = replace(options, task="detection")
    elif size[0] and size[1] and options.task in (None, "detection"):
        outputs = [t.shape for t in reference.outputs]
        detector = recognise(outputs, (int(size[0]), int(size[1])), meta, known)
    if detector is not None:
        progress(f"detector recognised: {detector.what}")
        if options.task is None:
            options = replace(options, task="detection")
    if names is not None:
        progress(f"{len(names)} class names from the model's own metadata")
    return SelfDescribed(options, names, detector)


def head_from(package_dir: Path, outputs: Sequence[tuple[int | None, ...]]) -> Recognised:
    """``--head-from``: the detector ``package_dir`` declares, for a file with its outputs.

    A detector retrained at the hub keeps its predecessor's grid and decode, which no output
    shape gives away; its outputs must still be the predecessor's, or its boxes would be read
    with the wrong head."""
    from edgeagent.models.package import PackageError, load_package

    try:
        package = load_package(package_dir)
    except PackageError as exc:
        raise PackagingError(f"--head-from {package_dir}: {exc}") from exc
    head = package.detection
    if head is None or package.preprocess is None:
        raise PackagingError(f"--head-from {package_dir}: {package.name} declares no detector")
    if head.style == "ssd":
        raise PackagingError(
            f"--head-from {package_dir}: an SSD head decodes against its anchors file, which "
            "is not carried over; package the model from its own source"
        )
    theirs = [tuple(t.shape[1:]) for t in package.outputs]
    ours = [tuple(-1 if d is None else d for d in shape[1:]) for shape in outputs]
    if ours != theirs:
        raise PackagingError(
            f"--head-from {package_dir}: the file's outputs {ours} are not {package.name}'s "
            f"{theirs} (batch dimension left out)"
        )
    what = f"the head of {package.name} {package.version} (--head-from)"
    return Recognised(head, len(package.labels), package.preprocess.letterbox, what)


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


def answered_outputs(logical: LogicalModel, measured: Mapping[str, np.ndarray]) -> LogicalModel:
    """Output shapes as the reference answered them, not as the file declares them.

    A file's declaration may be open (``[-1, 22, -1]`` would read as a one-class detector) or
    plain wrong (a recogniser declaring ``[1, seqlen]`` answers ``[T, 1, C]``). ``measured`` holds
    the reference's answers on the validation data: rows of a batch for a model that batches,
    a stack of whole answers for one that does not. The batch stays open; a dimension the file
    leaves open stays open when an input has an open dimension too (it follows that input's
    size), and is the answered size otherwise. A fixed dimension is always the answered one.
    """
    batches = logical.batches
    open_inputs = any(-1 in (t.shape[1:] if batches else t.shape) for t in logical.inputs)
    outputs = []
    for spec in logical.outputs:
        if spec.name not in measured:
            outputs.append(spec)
            continue
        sample = tuple(int(d) for d in measured[spec.name].shape[1:])
        answered = (-1, *sample) if batches else sample
        if len(answered) != len(spec.shape):  # the declaration is of another tensor
            declared = tuple(-1 if open_inputs else d for d in answered)
            shape = (-1, *declared[1:]) if batches else declared
        else:
            shape = tuple(
                -1 if want == -1 and ((batches and axis == 0) or open_inputs) else got
                for axis, (want, got) in enumerate(zip(spec.shape, answered, strict=True))
            )
        outputs.append(replace(spec, shape=shape))
    return replace(logical, outputs=tuple(outputs))
