"""Sample images for demos and tests: real photographs, a synthetic scene and digits."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageFilter
from sklearn.datasets import load_digits

from modelbuild.data import digit_image, sample_photos

DIGIT_SIZE = 64
SAMPLE_DIGITS = (0, 3, 7)  # class of the first example used for each file


def synthetic_scene(seed: int, width: int = 320, height: int = 240) -> Image.Image:
    """A smooth photo-like scene (sky gradient, hills, sun, texture noise), deterministic."""
    rng = np.random.default_rng(seed)
    rows = np.linspace(0, 1, height)[:, None, None]
    sky = (1 - rows) * np.array([90, 150, 230]) + rows * np.array([200, 220, 240])
    image = np.broadcast_to(sky, (height, width, 3)).copy()
    cols = np.arange(width)
    horizon = (0.6 + 0.08 * np.sin(cols / 37.0) + 0.04 * np.sin(cols / 11.0)) * height
    ground = np.arange(height)[:, None] > horizon[None, :]
    image[ground] = np.array([70, 120, 50]) + rng.normal(0, 12, (int(ground.sum()), 3))
    yy, xx = np.mgrid[0:height, 0:width]
    sun = (yy - 0.25 * height) ** 2 + (xx - 0.75 * width) ** 2 < (0.09 * height) ** 2
    image[sun] = (250, 230, 120)
    image += rng.normal(0, 4, image.shape)
    scene = Image.fromarray(np.clip(image, 0, 255).astype(np.uint8))
    return scene.filter(ImageFilter.GaussianBlur(0.8))


def write_samples(directory: Path, seed: int) -> None:
    """JPEG and PNG files; every format the agent accepts, photographs and digits alike."""
    directory.mkdir(parents=True, exist_ok=True)
    china, flower = sample_photos()
    for image, name in (
        (china, "china.jpg"),
        (flower, "flower.png"),
        (synthetic_scene(seed), "scene.jpg"),
    ):
        path = directory / name
        image.save(path, quality=90)  # PNG ignores quality
    digits = load_digits()
    for index, digit in enumerate(SAMPLE_DIGITS):
        row = digits.data[int(np.flatnonzero(digits.target == digit)[0])]
        suffix = "jpg" if index % 2 else "png"
        path = directory / f"digit_{digit}.{suffix}"
        image = digit_image(row, DIGIT_SIZE)
        image.save(path, quality=95)
