"""The tensor tables of a model package: ``[[inputs]]``, ``[[outputs]]``, ``[preprocess]`` and
``[postprocess]``, what a tensor model's clients send and get back.

A language model's package has none of them (``models.text_spec``); ``models.package`` reads the
rest of ``model.toml`` and re-exports these types for the modules that already import them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edgeagent.models.toml_fields import Fields, PackageError, floats

DTYPES = (
    "float32",
    "float16",
    "int8",
    "uint8",
    "int16",
    "int32",
    "int64",
    "bool",
)
LAYOUTS = ("NCHW", "NHWC")


@dataclass(frozen=True)
class TensorSpec:
    """A model input or output as clients see it (the logical tensor, before any variant layout)."""

    name: str
    dtype: str
    shape: tuple[int, ...]  # -1 marks a variable dimension (the batch)
    layout: str | None = None


@dataclass(frozen=True)
class Preprocess:
    """How an image becomes the input tensor; the fields mirror torchvision's usual transform."""

    size: tuple[int, int]  # (height, width) fed to the model
    resize: int | None  # shorter side before the centre crop; None = resize straight to size
    layout: str  # NCHW or NHWC
    color: str  # RGB, BGR or L
    scale: float  # pixel * scale before mean/std (1/255 maps 0..255 to 0..1)
    mean: tuple[float, ...]
    std: tuple[float, ...]
    # Scale to fit inside size keeping the aspect ratio and pad the rest (detectors trained on
    # letterboxed images, e.g. YOLO); excludes resize.
    letterbox: bool = False
    # The resampling filter of every resize (RESIZE_FILTERS): what the model's own pipeline
    # used, since a classifier trained on Lanczos-resized images scores differently on bilinear.
    resize_filter: str = "bilinear"


# The filters a package may name, as Pillow has them ("area" is Pillow's box filter, which
# averages every source pixel under a target one, as OpenCV's INTER_AREA does when shrinking).
RESIZE_FILTERS = ("bilinear", "nearest", "bicubic", "lanczos", "area", "hamming")


@dataclass(frozen=True)
class Postprocess:
    softmax: bool  # True when the output holds logits rather than probabilities
    top_k: int


def read_tensors(manifest: Path, key: str, tables: list) -> tuple[TensorSpec, ...]:
    if not tables:
        raise PackageError(f"{manifest}: {key}: at least one tensor is required")
    specs = []
    for index, table in enumerate(tables):
        fields = Fields(manifest, f"{key}[{index}]", table)
        fields.unknown({"name", "dtype", "shape", "layout"})
        shape = fields.get("shape", list)  # [] is a scalar (Silero VAD's sample rate)
        if not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
            fields.fail("must be a list of integers (-1 for a variable size, [] a scalar)", "shape")
        if any(d == 0 or d < -1 for d in shape):
            fields.fail("dimensions must be positive or -1", "shape")
        specs.append(
            TensorSpec(
                name=fields.get("name", str),
                dtype=fields.get("dtype", str, choices=DTYPES),
                shape=tuple(shape),
                layout=fields.get("layout", str, None, choices=LAYOUTS),
            )
        )
    return tuple(specs)


def read_preprocess(
    manifest: Path, table: dict | None, inputs: tuple[TensorSpec, ...]
) -> Preprocess | None:
    if table is None:
        return None
    fields = Fields(manifest, "preprocess", table)
    fields.unknown(
        {"size", "resize", "layout", "color", "scale", "mean", "std", "letterbox", "resize_filter"}
    )
    size = fields.get("size", list)
    if len(size) != 2 or not all(isinstance(v, int) and v > 0 for v in size):
        fields.fail("must be [height, width] in pixels", "size")
    color = fields.get("color", str, "RGB", choices=("RGB", "BGR", "L"))
    channels = 1 if color == "L" else 3
    mean = floats(fields, "mean", (0.0,) * channels)
    std = floats(fields, "std", (1.0,) * channels)
    if len(mean) != channels or len(std) != channels:
        fields.fail(f"mean and std need {channels} values for color {color}", "mean")
    if any(s == 0 for s in std):
        fields.fail("must not contain 0", "std")
    layout = fields.get("layout", str, inputs[0].layout or "NCHW", choices=LAYOUTS)
    resize = fields.get("resize", int, None)
    if resize is not None and resize < min(size):
        fields.fail(f"{resize} is smaller than the crop size {size}", "resize")
    letterbox = fields.get("letterbox", bool, False)
    if letterbox and resize is not None:
        fields.fail("letterbox pads instead of cropping: give it or resize, not both", "letterbox")
    return Preprocess(
        size=(size[0], size[1]),
        resize=resize,
        layout=layout,
        color=color,
        scale=float(fields.get("scale", (int, float), 1.0 / 255.0)),
        mean=mean,
        std=std,
        letterbox=letterbox,
        resize_filter=fields.get("resize_filter", str, "bilinear", choices=RESIZE_FILTERS),
    )


def read_postprocess(manifest: Path, table: dict) -> Postprocess:
    fields = Fields(manifest, "postprocess", table)
    fields.unknown({"softmax", "top_k"})
    top_k = fields.get("top_k", int, 5)
    if top_k < 1:
        fields.fail("must be at least 1", "top_k")
    return Postprocess(softmax=fields.get("softmax", bool, True), top_k=top_k)
