"""What the user adds to what the files say: the logical tensors, task and preprocessing.

Every gap a file leaves (an open image size, an unknown task, ambiguous channels) is refused
with the file's name and the flag that fills it, rather than guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from edgeagent.models.names import TEXT_TASKS
from edgeagent.models.package import TASKS, TensorSpec
from edgeagent.packaging.errors import PackagingError
from edgeagent.packaging.sources import NativeTensor, SourceModel, guess_layout


@dataclass(frozen=True)
class PackageOptions:
    """The command's flags, once parsed; None means "take it from the file"."""

    name: str | None = None
    version: str = "1.0.0"
    task: str | None = None
    labels: Path | None = None
    input_size: tuple[int, int] | None = None
    # --input-shape NAME=D0,D1,…: every dimension of one input; -1 keeps one the file leaves open
    input_shapes: tuple[tuple[str, tuple[int, ...]], ...] = ()
    softmax: bool | None = None  # None: applied unless the outputs already are probabilities
    layout: str | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    scale: float = 1.0 / 255.0
    bgr: bool = False
    crop: bool = False
    resize_filter: str | None = None  # None: the model's metadata's, else bilinear
    variants: tuple[str, ...] = ()
    weights: Path | None = None  # state_dict for a PyTorch file.py:factory source
    channels: int = 3  # image channels of a PyTorch source (the module does not say)
    tf_inputs: tuple[str, ...] = ()  # a TensorFlow graph's input nodes where discovery cannot tell
    tf_outputs: tuple[str, ...] = ()  # ... and its output nodes (see packaging.tensorflow_export)
    prune: tuple[float, ...] = ()  # --prune: channel ratios to try (packaging.pruning)
    prune_epochs: int = 0  # fine-tuning epochs of a pruned network on --calibration
    distil_from: Path | None = None  # --distil-from: the teacher package (packaging.distillation)
    distil_epochs: int = 0  # the student's training epochs on --calibration
    head_from: Path | None = None  # --head-from: a detector package whose head this file keeps
    calibration: Path | None = None
    calibration_method: str = "minmax"
    reduce_range: str = "auto"  # auto | on | off
    heldout: Path | None = None
    max_top1_drop: float = 1.0  # points of top-1 agreement a variant may lose against fp32
    max_images: int = 200
    threads: int | None = None
    timing_runs: int = 30  # batch-1 runs per variant whose median is its latency
    description: str = ""


@dataclass(frozen=True)
class LogicalModel:
    """The package's public face: tensors, layout and task, as model.toml will declare them."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    layout: str | None
    task: str
    softmax: bool = True  # a classifier's [postprocess] softmax (see packaging.probabilities)

    @property
    def batches(self) -> bool:
        """Every input has an open first (batch) dimension, so requests can be merged.

        A model whose batch is fixed (``[1, 16, 96]``) or whose inputs are not batched on
        their first dimension (Silero VAD's ``state [2, batch, 128]``, a scalar ``sr``) is
        served one request at a time, validated sample by sample and declares
        ``[serving] max_batch_size = 1``.
        """
        return all(len(t.shape) > 0 and t.shape[0] == -1 for t in self.inputs)


# What a file name may carry after the model's own name: a precision (``mobilenet.int8.onnx``,
# the packager's own variant names) or an optimisation tag. Only these are cut, so a version in
# the name stays (``hey_jarvis_v0.1.onnx`` is ``hey_jarvis_v0.1``).
NAME_TAGS = frozenset({"fp32", "fp16", "int8", "uint8", "float32", "float16", "quant", "opt"})


def default_name(path: Path) -> str:
    """The package name ``--name`` defaults to: the file's stem less its known tags.

    Characters a model name may not hold (``models.names.NAME_RE``: letters, digits, ``_``,
    ``-``, ``.``) become ``_``, and it is cut to the 64 characters a name may have.
    """
    parts = path.stem.split(".")
    while len(parts) > 1 and parts[-1].lower() in NAME_TAGS:
        parts.pop()
    name = re.sub(r"[^A-Za-z0-9_.-]", "_", ".".join(parts)).lstrip("_.-") or "model"
    return name[:64]


def logical_model(reference: SourceModel, options: PackageOptions) -> LogicalModel:
    """The logical tensors from the reference file plus the flags; refuse what stays open.

    Every input is kept, each with its own name, dtype and shape. The first dimension stays
    open (-1, the batch) where the file leaves it open, or where the runtime feeds a fixed
    batch of 1 row by row (LiteRT); a fixed one (an ONNX or IR with batch 1) is kept, since
    that runtime refuses any other batch.
    """
    known = {t.name for t in reference.inputs}
    for name, _ in options.input_shapes:
        if name not in known:
            raise PackagingError(
                f"--input-shape {name}=…: {reference.path} has no input {name!r} "
                f"(inputs: {', '.join(t.name for t in reference.inputs)})"
            )
    first = reference.inputs[0]
    layout = options.layout or guess_layout(_given(first, options) or first.shape)
    if len(first.shape) == 4 and layout is None:
        raise PackagingError(
            f"{reference.path}: cannot tell whether input {first.name!r} "
            f"{_dims(first.shape)} is NCHW or NHWC: pass --layout NCHW|NHWC"
        )
    rows_of_one = reference.runtime == "litert"  # LiteRT runs a batch-1 graph row by row
    inputs = tuple(
        _fixed_input(reference, t, layout if t is first else None, options, rows_of_one)
        for t in reference.inputs
    )
    batches = all(len(t.shape) > 0 and t.shape[0] == -1 for t in inputs)
    outputs = tuple(
        TensorSpec(
            t.name,
            "float32",
            (-1, *(d or -1 for d in t.shape[1:])) if batches else tuple(d or -1 for d in t.shape),
        )
        for t in reference.outputs
    )
    logical = LogicalModel(inputs, outputs, layout, _task(reference, options))
    int8 = "int8" in options.variants or (not options.variants and options.calibration)
    if int8 and (len(inputs) > 1 or not batches):
        raise PackagingError(
            f"{reference.path}: an int8 variant is made for one-input models with an open batch; "
            f"this one has {len(inputs)} input(s)"
            + ("" if batches else " and a fixed batch")
            + ": leave out --calibration and int8 (give the validation data with --heldout)"
        )
    return logical


def _given(tensor: NativeTensor, options: PackageOptions) -> tuple[int | None, ...] | None:
    shape = dict(options.input_shapes).get(tensor.name)
    return None if shape is None else tuple(None if d == -1 else d for d in shape)


def _fixed_input(
    reference: SourceModel,
    tensor: NativeTensor,
    layout: str | None,
    options: PackageOptions,
    rows_of_one: bool,
) -> TensorSpec:
    """The input's logical shape: the file's, with --input-shape (any rank) or --input-size
    (a 4-D image's height and width) filling what it leaves open; what stays open (other than
    the batch) is refused, naming both flags."""
    dims: list[int | None] = list(tensor.shape)
    given = dict(options.input_shapes).get(tensor.name)
    if given is not None:
        dims = _apply(reference, tensor, given)
    elif len(dims) == 4 and layout is not None and options.input_size is not None:
        spatial = (2, 3) if layout == "NCHW" else (1, 2)
        dims[spatial[0]], dims[spatial[1]] = options.input_size
    if dims and (dims[0] is None or (rows_of_one and dims[0] == 1)):
        dims[0] = -1  # the batch
    open_dims = [i for i, d in enumerate(dims) if d is None]
    if open_dims:
        template = ",".join(
            f"D{i}" if d is None else str(d) for i, d in enumerate(dims)
        )  # e.g. -1,D1 for [batch, samples]
        image = "--input-size HEIGHT,WIDTH or " if len(dims) == 4 else ""
        raise PackagingError(
            f"{reference.path}: input {tensor.name!r} {_dims(tensor.shape)} leaves dimension(s) "
            f"{', '.join(map(str, open_dims))} open: pass {image}"
            f"--input-shape {tensor.name}={template} (-1 keeps a dimension open)"
        )
    dtype = "float32" if tensor.dtype in ("float16", "int8", "uint8") else tensor.dtype
    return TensorSpec(tensor.name, dtype, tuple(int(d) for d in dims if d is not None), layout)


def _apply(
    reference: SourceModel, tensor: NativeTensor, given: tuple[int, ...]
) -> list[int | None]:
    """``--input-shape`` over the file's shape: same rank, fixed dimensions kept as they are."""
    flag = f"--input-shape {tensor.name}={','.join(map(str, given))}"
    if len(given) != len(tensor.shape):
        raise PackagingError(
            f"{flag}: {len(given)} dimension(s), but input {tensor.name!r} of {reference.path} "
            f"has {len(tensor.shape)} {_dims(tensor.shape)}"
        )
    dims: list[int | None] = []
    for axis, (want, have) in enumerate(zip(given, tensor.shape, strict=True)):
        if have is not None and want != have:
            raise PackagingError(
                f"{flag}: dimension {axis} is fixed at {have} in {reference.path} "
                f"{_dims(tensor.shape)}"
            )
        dims.append(want)  # -1 stays open on purpose; a size fills the file's open one
    return dims


def _task(reference: SourceModel, options: PackageOptions) -> str:
    if options.task is not None:
        if options.task in TEXT_TASKS:  # a language model's (GGUF) tasks, served by llama.cpp
            raise PackagingError(
                f"--task {options.task}: a language-model task (GGUF sources); {reference.path} "
                "is a tensor model: pass --task tensor (for feature vectors too)"
            )
        if options.task not in TASKS:
            raise PackagingError(f"--task {options.task!r}: one of {', '.join(TASKS)}")
        return options.task
    outputs = reference.outputs
    shape = outputs[0].shape
    if len(outputs) == 1 and len(shape) >= 2 and all(d == 1 for d in shape[1:-1]):
        return "classification"  # [batch, classes] or [batch, 1, 1, classes]
    shapes = ", ".join(f"{t.name} {_dims(t.shape)}" for t in outputs)
    tensor_tasks = [t for t in TASKS if t not in TEXT_TASKS]
    raise PackagingError(
        f"{reference.path}: cannot tell the task from its outputs ({shapes}): "
        f"pass --task {'|'.join(tensor_tasks)}"
    )


def _dims(shape: tuple[int | None, ...]) -> str:
    return "[" + ", ".join("?" if d is None or d < 0 else str(d) for d in shape) + "]"
