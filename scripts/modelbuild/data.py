"""Real, bundled, offline data: the two photographs scikit-learn ships and its digits set.

No ImageNet can be downloaded here, so the ImageNet-shaped models are calibrated on random
crops of real photographs (not noise): BatchNorm re-estimation and INT8 calibration then see
the value distributions natural images produce.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image
from sklearn.datasets import load_digits, load_sample_images
from sklearn.model_selection import train_test_split

DIGIT_LEVELS = 16  # sklearn digits are 8×8 with intensities 0..16
HELDOUT_FRACTION = 0.2
SPLIT_SEED = 0  # the held-out split never changes with the build seed


def sample_photos() -> list[Image.Image]:
    """The two real photographs bundled with scikit-learn (china.jpg, flower.jpg), 640×427."""
    return [Image.fromarray(image) for image in load_sample_images().images]


def photo_crops(count: int, size: int, seed: int) -> np.ndarray:
    """``count`` random-resized crops (uint8 NHWC, size×size), like Inception-style augmentation.

    Crops cover 10-100 % of a photo's area with aspect 3/4..4/3 and random horizontal flips.
    """
    rng = np.random.default_rng(seed)
    photos = sample_photos()
    out = np.empty((count, size, size, 3), np.uint8)
    for index in range(count):
        photo = photos[index % len(photos)]
        width, height = photo.size
        area = width * height * rng.uniform(0.1, 1.0)
        aspect = np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3)))
        crop_w = int(min(width, round(np.sqrt(area * aspect))))
        crop_h = int(min(height, round(np.sqrt(area / aspect))))
        left = int(rng.integers(0, width - crop_w + 1))
        top = int(rng.integers(0, height - crop_h + 1))
        crop = photo.crop((left, top, left + crop_w, top + crop_h))
        crop = crop.resize((size, size), Image.Resampling.BILINEAR)
        if rng.random() < 0.5:
            crop = crop.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        out[index] = np.asarray(crop)
    return out


def normalize(images: np.ndarray, scale: float, mean: tuple, std: tuple) -> np.ndarray:
    """uint8 NHWC → float32 NCHW exactly as the agent's preprocessing does it."""
    pixels = images.astype(np.float32) * np.float32(scale)
    pixels = (pixels - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)
    return np.ascontiguousarray(pixels.transpose(0, 3, 1, 2))


def digit_image(pixels: np.ndarray, size: int) -> Image.Image:
    """One 8×8 digit (0..16) as a greyscale image upscaled to size×size (white ink on black)."""
    grey = np.round(pixels.reshape(8, 8) * (255 / DIGIT_LEVELS)).astype(np.uint8)
    return Image.fromarray(grey, mode="L").resize((size, size), Image.Resampling.BILINEAR)


@dataclass(frozen=True)
class DigitsSplit:
    """Upscaled digits as uint8 NHWC (one channel) with a fixed stratified held-out split."""

    train_images: np.ndarray
    train_labels: np.ndarray
    heldout_images: np.ndarray
    heldout_labels: np.ndarray


def digits_split(size: int) -> DigitsSplit:
    digits = load_digits()
    images = np.stack([np.asarray(digit_image(row, size)) for row in digits.data])[..., None]
    labels = digits.target.astype(np.int64)
    train_x, held_x, train_y, held_y = train_test_split(
        images, labels, test_size=HELDOUT_FRACTION, random_state=SPLIT_SEED, stratify=labels
    )
    return DigitsSplit(train_x, train_y, held_x, held_y)
