"""The zoo detector's held-out scenes (``heldout.npz``), as the tests and the benchmark read them.

The build stores every object as one row of (scene index, class, x_min, y_min, x_max, y_max)
in pixels; this turns them back into per-scene boxes and labels, and a scene into the PNG a
client would send.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image


@dataclass(frozen=True)
class HeldOut:
    images: np.ndarray  # uint8 NHWC RGB
    boxes: list[np.ndarray]  # per scene: float32 [k, 4] corner boxes in pixels
    labels: list[np.ndarray]  # per scene: int64 [k] class indices

    def png(self, index: int) -> bytes:
        """Scene ``index`` encoded losslessly, as a camera integration would post it."""
        buffer = io.BytesIO()
        Image.fromarray(self.images[index]).save(buffer, format="PNG")
        return buffer.getvalue()


def load_heldout(package_dir: Path, limit: int | None = None) -> HeldOut:
    """The first ``limit`` held-out scenes (all by default) of a detector package."""
    with np.load(package_dir / "heldout.npz") as stored:
        images, objects = stored["images"], stored["objects"]
    count = len(images) if limit is None else min(limit, len(images))
    scene = objects[:, 0].astype(np.int64)
    boxes = [objects[scene == i, 2:6].astype(np.float32) for i in range(count)]
    labels = [objects[scene == i, 1].astype(np.int64) for i in range(count)]
    return HeldOut(images[:count], boxes, labels)


def night(images: np.ndarray, seed: int = 0) -> np.ndarray:
    """The same scenes from a camera at night: a third of the light, the green cast of a
    sensor without its IR-cut filter, and sensor noise (the shift a retrained head answers)."""
    rng = np.random.default_rng(seed)
    pixels = images.astype(np.float32) * 0.3
    pixels[..., 1] += 40
    pixels += rng.normal(0, 14, pixels.shape)
    return np.clip(pixels, 0, 255).astype(np.uint8)
