"""Image → input tensor, and logits → labelled top-k, as a package's model.toml describes.

The transform is the usual ImageNet one (shorter-side resize, centre crop, scale, mean/std), done
with Pillow and numpy only so that it runs the same on every board. Decoding is bounded: a
decompression bomb is refused rather than allowed to exhaust a small device's memory.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np
from PIL import Image, UnidentifiedImageError

from edgeagent.models.package import Preprocess

ACCEPTED_FORMATS = ("JPEG", "PNG")
MAX_IMAGE_PIXELS = 40_000_000  # ~ a 7700×5200 photo; larger images are refused, not decoded


class ImageError(ValueError):
    """The bytes are not an image this agent accepts; the message says why."""


@dataclass(frozen=True)
class Prediction:
    label: str
    index: int
    score: float


def decode_image(data: bytes, max_pixels: int = MAX_IMAGE_PIXELS) -> Image.Image:
    """Decode JPEG/PNG bytes, refusing other formats, truncated files and oversized images."""
    if not data:
        raise ImageError("empty body: expected a JPEG or PNG image")
    try:
        image = Image.open(io.BytesIO(data))
    except UnidentifiedImageError as exc:
        raise ImageError("not a JPEG or PNG image") from exc
    except Image.DecompressionBombError as exc:  # dimensions far beyond max_pixels
        raise ImageError(f"image refused: {exc}") from exc
    except (OSError, SyntaxError) as exc:  # a header cut short or broken ("Truncated File Read")
        raise ImageError(f"corrupt image: {exc}") from exc
    if image.format not in ACCEPTED_FORMATS:
        raise ImageError(f"{image.format} images are not accepted (JPEG or PNG only)")
    width, height = image.size
    if width * height > max_pixels:
        raise ImageError(f"image of {width}×{height} pixels exceeds the limit of {max_pixels}")
    try:
        image.load()
    except (OSError, SyntaxError) as exc:
        raise ImageError(f"corrupt {image.format} image: {exc}") from exc
    return image


def resize_and_crop(image: Image.Image, spec: Preprocess) -> Image.Image:
    """Shorter side to ``spec.resize`` then centre crop, or straight to ``spec.size``."""
    height, width = spec.size
    if spec.resize is None:
        return image.resize((width, height), Image.Resampling.BILINEAR)
    scale = spec.resize / min(image.size)
    resized = image.resize(
        (max(width, round(image.width * scale)), max(height, round(image.height * scale))),
        Image.Resampling.BILINEAR,
    )
    left = (resized.width - width) // 2
    top = (resized.height - height) // 2
    return resized.crop((left, top, left + width, top + height))


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
    normalised = (pixels * np.float32(spec.scale) - mean) / std
    if spec.layout == "NCHW":
        normalised = normalised.transpose(2, 0, 1)
    return np.ascontiguousarray(normalised[None], dtype=np.float32)


def preprocess_image(data: bytes, spec: Preprocess) -> np.ndarray:
    """Encoded image bytes → a batch-of-one input tensor for the package's model."""
    return to_tensor(resize_and_crop(decode_image(data), spec), spec)


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
