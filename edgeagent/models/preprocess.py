"""Image → input tensor, and logits → labelled top-k, as a package's model.toml describes.

The transform is the usual ImageNet one (shorter-side resize, centre crop, scale, mean/std), done
with Pillow and numpy only so that it runs the same on every board. Decoding is bounded: a
decompression bomb is refused rather than allowed to exhaust a small device's memory.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from edgeagent.models.package import Preprocess
from edgeagent.models.tasks.detection import (
    Geometry,
    crop_geometry,
    letterbox_geometry,
    stretch_geometry,
)

if TYPE_CHECKING:
    from PIL import Image

# Pillow (2 MB resident) is imported by the first image, not by a daemon serving tensors only.

ACCEPTED_FORMATS = ("JPEG", "PNG")
MAX_IMAGE_PIXELS = 40_000_000  # ~ a 7700×5200 photo; larger images are refused, not decoded


class ImageError(ValueError):
    """The bytes are not an image this agent accepts; the message says why."""


@dataclass(frozen=True)
class Prediction:
    label: str
    index: int
    score: float


def open_image(data: bytes, max_pixels: int = MAX_IMAGE_PIXELS) -> Image.Image:
    """Read an image's header only: JPEG/PNG, not truncated there, at most ``max_pixels``.

    No pixel is decoded yet (Pillow decodes lazily), so a caller can reserve the memory the
    decoded image will take (its width × height) before ``load_pixels`` allocates it.
    """
    if not data:
        raise ImageError("empty body: expected a JPEG or PNG image")
    from PIL import Image, UnidentifiedImageError

    try:
        image = Image.open(io.BytesIO(data))
    except UnidentifiedImageError as exc:
        raise ImageError("not a JPEG or PNG image") from exc
    except Image.DecompressionBombError as exc:  # dimensions far beyond max_pixels
        raise ImageError(f"image refused: {exc}") from exc
    except (OSError, SyntaxError, ValueError) as exc:  # a header cut short or broken
        raise ImageError(f"corrupt image: {exc}") from exc  # ("Truncated IHDR chunk" …)
    if image.format not in ACCEPTED_FORMATS:
        raise ImageError(f"{image.format} images are not accepted (JPEG or PNG only)")
    width, height = image.size
    if width * height > max_pixels:
        raise ImageError(f"image of {width}×{height} pixels exceeds the limit of {max_pixels}")
    return image


def load_pixels(image: Image.Image) -> Image.Image:
    """Decode an opened image's pixels; a body cut short or corrupt is an ImageError."""
    try:
        image.load()
    except (OSError, SyntaxError, ValueError) as exc:
        raise ImageError(f"corrupt {image.format} image: {exc}") from exc
    return image


def decode_image(data: bytes, max_pixels: int = MAX_IMAGE_PIXELS) -> Image.Image:
    """Decode JPEG/PNG bytes, refusing other formats, truncated files and oversized images."""
    return load_pixels(open_image(data, max_pixels))


LETTERBOX_FILL = 114  # the grey YOLO-family detectors are trained to ignore


def resize_and_crop(image: Image.Image, spec: Preprocess) -> Image.Image:
    """Shorter side to ``spec.resize`` then centre crop, a letterbox, or straight to size."""
    from PIL import Image

    height, width = spec.size
    if spec.letterbox:
        fit = letterbox_geometry(image.size, (width, height))
        mode = "L" if spec.color == "L" else "RGB"
        scaled = image.convert(mode).resize(
            (max(1, round(image.width * fit.scale[0])), max(1, round(image.height * fit.scale[1]))),
            _filter(spec),
        )
        fill = LETTERBOX_FILL if mode == "L" else (LETTERBOX_FILL,) * 3
        canvas = Image.new(mode, (width, height), fill)
        canvas.paste(scaled, (int(fit.offset[0]), int(fit.offset[1])))
        return canvas
    if spec.resize is None:
        return image.resize((width, height), _filter(spec))
    scale = spec.resize / min(image.size)
    resized = image.resize(
        (max(width, round(image.width * scale)), max(height, round(image.height * scale))),
        _filter(spec),
    )
    left = (resized.width - width) // 2
    top = (resized.height - height) // 2
    return resized.crop((left, top, left + width, top + height))


def _filter(spec: Preprocess) -> Image.Resampling:
    """Pillow's filter for the package's ``resize_filter`` (``area`` is Pillow's box filter)."""
    from PIL import Image

    name = "box" if spec.resize_filter == "area" else spec.resize_filter
    return Image.Resampling[name.upper()]


def to_tensor(image: Image.Image, spec: Preprocess) -> np.ndarray:
    """Pixels → normalised float32 tensor of shape (1, C, H, W) or (1, H, W, C)."""
    mode = "L" if spec.color == "L" else "RGB"
    pixels = np.asarray(image.convert(mode), dtype=np.float32)
    if pixels.ndim == 2:
        pixels = pixels[:, :, None]
    if spec.color == "BGR":
        pixels = pixels[:, :, ::-1]
    mean = np.asarray(spec.mean, dtype=np.float32)
    std = np.asarray(spec.std, dtype=np.float32)
    channels = pixels.shape[2]
    if mean.size != channels or std.size != channels:  # broadcast as the package asks
        normalised = (pixels * np.float32(spec.scale) - mean) / std
        if spec.layout == "NCHW":
            normalised = normalised.transpose(2, 0, 1)
        return np.ascontiguousarray(normalised[None], dtype=np.float32)
    # One channel at a time, the same arithmetic: broadcasting a 3-value mean over H×W×3 runs
    # numpy's inner loop 3 elements long, ~15× slower (11 ms for a 300×300 frame here).
    nchw = spec.layout == "NCHW"
    height, width = pixels.shape[:2]
    shape = (1, channels, height, width) if nchw else (1, height, width, channels)
    out = np.empty(shape, np.float32)
    scale = np.float32(spec.scale)
    for channel in range(channels):
        plane = out[0, channel] if nchw else out[0, :, :, channel]
        np.multiply(pixels[:, :, channel], scale, out=plane)
        np.subtract(plane, mean[channel], out=plane)
        np.divide(plane, std[channel], out=plane)
    return out


def preprocess_image(data: bytes, spec: Preprocess) -> np.ndarray:
    """Encoded image bytes → a batch-of-one input tensor for the package's model."""
    return image_tensor(open_image(data), spec)


def image_tensor(image: Image.Image, spec: Preprocess) -> np.ndarray:
    """An opened image (``open_image``) decoded → a batch-of-one input tensor."""
    return to_tensor(resize_and_crop(load_pixels(image), spec), spec)


def geometry_of(image_size: tuple[int, int], spec: Preprocess) -> Geometry:
    """How ``resize_and_crop`` maps an image of ``image_size`` (width, height) to the input."""
    model = (spec.size[1], spec.size[0])
    if spec.letterbox:
        return letterbox_geometry(image_size, model)
    if spec.resize is None:
        return stretch_geometry(image_size, model)
    return crop_geometry(image_size, model, spec.resize)


def prepare_image(data: bytes, spec: Preprocess) -> tuple[np.ndarray, Geometry]:
    """``preprocess_image`` plus the geometry that maps input pixels back to the image's own
    (what a detector's boxes need)."""
    return prepare_opened(open_image(data), spec)


def prepare_opened(image: Image.Image, spec: Preprocess) -> tuple[np.ndarray, Geometry]:
    """``prepare_image`` of an image opened by ``open_image``."""
    return image_tensor(image, spec), geometry_of(image.size, spec)


def softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    exp = np.exp(shifted)
    return exp / exp.sum(axis=-1, keepdims=True)


def top_k(
    scores: np.ndarray, labels: tuple[str, ...] | list[str], k: int, apply_softmax: bool
) -> list[Prediction]:
    """Best ``k`` classes of one row of logits or probabilities, highest first."""
    row = np.asarray(scores, dtype=np.float32).reshape(-1)
    probabilities = softmax(row) if apply_softmax else row
    k = max(1, min(k, row.size))
    best = np.argpartition(-probabilities, k - 1)[:k]
    best = best[np.argsort(-probabilities[best], kind="stable")]
    return [
        Prediction(
            label=labels[i] if i < len(labels) else str(i),
            index=int(i),
            score=float(probabilities[i]),
        )
        for i in best
    ]


def prepare_pixels(pixels: np.ndarray, spec: Preprocess) -> tuple[np.ndarray, Geometry]:
    """``prepare_image`` of a frame already decoded to RGB (height × width × 3, uint8)."""
    from PIL import Image

    return prepare_opened(Image.fromarray(pixels, "RGB"), spec)
