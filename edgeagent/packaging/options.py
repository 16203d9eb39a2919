"""What the user adds to what the files say: the logical tensors, task and preprocessing.

Every gap a file leaves (an open image size, an unknown task, ambiguous channels) is refused
with the file's name and the flag that fills it, rather than guessed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from edgeagent.models.package import TASKS, TensorSpec
from edgeagent.packaging.errors import PackagingError
from edgeagent.packaging.sources import NativeTensor, SourceModel


@dataclass(frozen=True)
class PackageOptions:
    """The command's flags, once parsed; None means "take it from the file"."""

    name: str | None = None
    version: str = "1.0.0"
    task: str | None = None
    labels: Path | None = None
    input_size: tuple[int, int] | None = None
    layout: str | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    scale: float = 1.0 / 255.0
    bgr: bool = False
    crop: bool = False
    variants: tuple[str, ...] = ()
    weights: Path | None = None  # state_dict for a PyTorch file.py:factory source
    channels: int = 3  # image channels of a PyTorch source (the module does not say)
    calibration: Path | None = None
    calibration_method: str = "minmax"
    reduce_range: str = "auto"  # auto | on | off
    heldout: Path | None = None
    max_top1_drop: float = 1.0  # points of top-1 agreement a variant may lose against fp32
    max_images: int = 200
    threads: int | None = None
    description: str = ""


@dataclass(frozen=True)
class LogicalModel:
    """The package's public face: tensors, layout and task, as model.toml will declare them."""

    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    layout: str | None
    task: str


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
    """The logical tensors from the reference file plus the flags; refuse what stays open."""
    if len(reference.inputs) != 1:
        names = ", ".join(t.name for t in reference.inputs)
        raise PackagingError(
            f"{reference.path}: {len(reference.inputs)} inputs ({names}): edgeagent package "
            "handles one-input models; write model.toml by hand for this one"
        )
    layout = options.layout or reference.layout
    if len(reference.inputs[0].shape) == 4 and layout is None:
        raise PackagingError(
            f"{reference.path}: cannot tell whether input {reference.inputs[0].name!r} "
            f"{_dims(reference.inputs[0].shape)} is NCHW or NHWC: pass --layout NCHW|NHWC"
        )
    inputs = tuple(_fixed_input(reference, t, layout, options) for t in reference.inputs)
    outputs = tuple(
        TensorSpec(t.name, "float32", (-1, *(d or -1 for d in t.shape[1:])))
        for t in reference.outputs
    )
    return LogicalModel(inputs, outputs, layout, _task(reference, options))


def _fixed_input(
    reference: SourceModel, tensor: NativeTensor, layout: str | None, options: PackageOptions
) -> TensorSpec:
    """Batch stays open (-1); every other open dimension must come from --input-size."""
    dims = list(tensor.shape)
    if len(dims) == 4 and layout is not None:
        spatial = (2, 3) if layout == "NCHW" else (1, 2)
        if options.input_size is not None:
            dims[spatial[0]], dims[spatial[1]] = options.input_size
    open_dims = [i for i, d in enumerate(dims[1:], start=1) if d is None]
    if open_dims:
        raise PackagingError(
            f"{reference.path}: input {tensor.name!r} {_dims(tensor.shape)} leaves dimension(s) "
            f"{', '.join(map(str, open_dims))} open: pass --input-size HEIGHT,WIDTH"
        )
    dtype = "float32" if tensor.dtype in ("float16", "int8", "uint8") else tensor.dtype
    return TensorSpec(
        tensor.name, dtype, (-1, *(int(d) for d in dims[1:] if d is not None)), layout
    )


def _task(reference: SourceModel, options: PackageOptions) -> str:
    if options.task is not None:
        if options.task not in TASKS:
            raise PackagingError(f"--task {options.task!r}: one of {', '.join(TASKS)}")
        return options.task
    outputs = reference.outputs
    if len(outputs) == 1 and len(outputs[0].shape) == 2:
        return "classification"
    shapes = ", ".join(f"{t.name} {_dims(t.shape)}" for t in outputs)
    raise PackagingError(
        f"{reference.path}: cannot tell the task from its outputs ({shapes}): "
        f"pass --task {'|'.join(TASKS)}"
    )


def _dims(shape: tuple[int | None, ...]) -> str:
    return "[" + ", ".join("?" if d is None or d < 0 else str(d) for d in shape) + "]"
