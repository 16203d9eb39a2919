"""A captured frame made safe to keep: regions blurred, shrunk, re-encoded as JPEG.

Redaction happens on the decoded pixels before anything is encoded or written, so no
unblurred copy exists on disk even for a moment. A region is pixelated (to at most 8 blocks a
side) and then blurred: a blur alone of a small face can be partly undone, a mosaic of 8×8
blocks carries too little to recover one.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np
from PIL import Image, ImageFilter

Box = Sequence[float]  # x1, y1, x2, y2 in the image's own pixels
FRAME_QUALITY = 95  # a frame's first encoding; the stored one uses [capture] jpeg_quality


def blur_regions(image: Image.Image, boxes: Sequence[Box]) -> Image.Image:
    """``image`` with every box pixelated and blurred (in place on a copy)."""
    out = image.copy()
    for box in boxes:
        x1, y1, x2, y2 = (round(v) for v in box)
        x1, y1 = max(0, x1), max(0, y1)
        x2, y2 = min(out.width, x2), min(out.height, y2)
        if x2 <= x1 or y2 <= y1:
            continue
        region = out.crop((x1, y1, x2, y2))
        blocks = (max(1, min(8, region.width)), max(1, min(8, region.height)))
        mosaic = region.resize(blocks, Image.Resampling.BILINEAR).resize(
            region.size, Image.Resampling.NEAREST
        )
        radius = max(2, min(region.size) // 4)
        out.paste(mosaic.filter(ImageFilter.GaussianBlur(radius)), (x1, y1))
    return out


def frame_jpeg(frame: Image.Image | np.ndarray) -> bytes:
    """A decoded frame (a camera's, or Frigate's RGB pixels) as a near-lossless JPEG, to be
    redacted and stored like an uploaded image; made only for a frame the rules kept."""
    image = frame if isinstance(frame, Image.Image) else Image.fromarray(frame)
    out = io.BytesIO()
    image.convert("RGB").save(out, "JPEG", quality=FRAME_QUALITY)
    return out.getvalue()


def prepare(
    data: bytes, blur: Sequence[Box], max_side: int, quality: int
) -> tuple[bytes, float, tuple[int, int]]:
    """(JPEG bytes, scale from the original's pixels to the stored ones, stored size)."""
    with Image.open(io.BytesIO(data)) as opened:
        opened.load()
        image = opened.convert("RGB")
    if blur:
        image = blur_regions(image, blur)
    scale = min(1.0, max_side / max(image.width, image.height))
    if scale < 1.0:
        size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
        image = image.resize(size, Image.Resampling.LANCZOS)
    out = io.BytesIO()
    image.save(out, "JPEG", quality=quality)
    return out.getvalue(), scale, image.size
