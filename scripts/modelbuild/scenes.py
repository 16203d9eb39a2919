"""Synthetic detection scenes: one to four filled shapes of four kinds on varied backgrounds.

No detection data set can be downloaded here, so the zoo's detector learns from scenes made on
the spot. Backgrounds vary the way camera frames do — crops of the two photographs scikit-learn
ships (real edges and textures), smooth colour gradients, and either of them under sensor-like
noise — so the network cannot key on a flat background. Shapes are large (a fifth to half the
scene's side, aspect 0.7-1.4), in a colour far from the background under them, overlapping
little; every box is exact, so mAP measures the network, not the labels.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

from modelbuild.data import photo_crops
from modelbuild.labels import SHAPES

MIN_SIDE, MAX_SIDE = 0.2, 0.5  # object size as a fraction of the scene's side
MAX_OBJECTS = 4
MAX_OVERLAP_IOU = 0.15
NOISE_SIGMA = 12.0  # grey levels, on the noisy half of the scenes


@dataclass(frozen=True)
class Scenes:
    """Images with their objects: per image a float32 ``[k, 4]`` array of pixel corner boxes
    (x_min, y_min, x_max, y_max) and an int64 ``[k]`` array of indices into ``SHAPES``."""

    images: np.ndarray  # uint8 NHWC, RGB
    boxes: list[np.ndarray]
    labels: list[np.ndarray]


def _overlap(box: np.ndarray, others: list[np.ndarray]) -> float:
    """The largest IoU of ``box`` with any of ``others`` (0 when there are none)."""
    if not others:
        return 0.0
    stack = np.stack(others)
    inter = np.prod(
        np.clip(np.minimum(box[2:], stack[:, 2:]) - np.maximum(box[:2], stack[:, :2]), 0, None),
        axis=1,
    )
    areas = np.prod(stack[:, 2:] - stack[:, :2], axis=1)
    return float((inter / (np.prod(box[2:] - box[:2]) + areas - inter)).max())


def _gradients(count: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """Linear blends between two random colours in a random direction (uint8 NHWC)."""
    angle = rng.uniform(0, 2 * np.pi, count)
    ys, xs = np.mgrid[0:size, 0:size] / (size - 1)
    ramp = np.cos(angle)[:, None, None] * xs + np.sin(angle)[:, None, None] * ys
    ramp = (ramp - ramp.min(axis=(1, 2), keepdims=True)) / np.ptp(ramp, axis=(1, 2), keepdims=True)
    start, end = rng.uniform(0, 255, (2, count, 1, 1, 3))
    return (start + (end - start) * ramp[..., None]).astype(np.uint8)


def _backgrounds(count: int, size: int, rng: np.random.Generator, seed: int) -> np.ndarray:
    """Photo crops for two thirds of the scenes, colour gradients for the rest."""
    images = photo_crops(count, size, seed + 7)
    plain = rng.random(count) < 1 / 3
    images[plain] = _gradients(int(plain.sum()), size, rng)
    return images


def _colour(rng: np.random.Generator, under: np.ndarray) -> tuple[int, int, int]:
    """A colour far from the mean of the pixels the shape covers, so every shape is visible."""
    mean = under.reshape(-1, 3).mean(axis=0)
    colour = rng.integers(0, 256, 3)
    for _ in range(30):
        if np.abs(colour - mean).sum() > 200:
            break
        colour = rng.integers(0, 256, 3)
    return int(colour[0]), int(colour[1]), int(colour[2])


def _draw(draw: ImageDraw.ImageDraw, kind: str, box: np.ndarray, fill: tuple[int, int, int]):
    x0, y0, x1, y1 = (float(v) for v in box)
    if kind == "ellipse":
        draw.ellipse((x0, y0, x1, y1), fill=fill)
    elif kind == "rectangle":
        draw.rectangle((x0, y0, x1, y1), fill=fill)
    elif kind == "triangle":
        draw.polygon([((x0 + x1) / 2, y0), (x1, y1), (x0, y1)], fill=fill)
    else:
        bar_w, bar_h = (x1 - x0) / 3, (y1 - y0) / 3
        draw.rectangle((x0, y0 + bar_h, x1, y1 - bar_h), fill=fill)
        draw.rectangle((x0 + bar_w, y0, x1 - bar_w, y1), fill=fill)


def _place(rng: np.random.Generator, size: int, taken: list[np.ndarray]) -> np.ndarray | None:
    """A box that overlaps the ones already placed by at most ``MAX_OVERLAP_IOU``, or None."""
    for _attempt in range(20):
        side = rng.uniform(MIN_SIDE, MAX_SIDE) * size
        aspect = np.exp(rng.uniform(np.log(0.7), np.log(1.4)))
        width, height = min(size, side * np.sqrt(aspect)), min(size, side / np.sqrt(aspect))
        x0, y0 = rng.uniform(0, size - width), rng.uniform(0, size - height)
        box = np.array([x0, y0, x0 + width, y0 + height], np.float32)
        if _overlap(box, taken) <= MAX_OVERLAP_IOU:
            return box
    return None


def make_scenes(count: int, size: int, seed: int) -> Scenes:
    """``count`` scenes of ``size``×``size`` pixels, the same for the same ``seed``."""
    rng = np.random.default_rng(seed)
    images = _backgrounds(count, size, rng, seed)
    all_boxes, all_labels = [], []
    for index in range(count):
        image = Image.fromarray(images[index])
        draw = ImageDraw.Draw(image)
        boxes: list[np.ndarray] = []
        labels: list[int] = []
        for _ in range(int(rng.integers(1, MAX_OBJECTS + 1))):
            box = _place(rng, size, boxes)
            if box is None:
                continue
            x0, y0, x1, y1 = box.astype(int)
            kind = int(rng.integers(0, len(SHAPES)))
            colour = _colour(rng, images[index, y0 : y1 + 1, x0 : x1 + 1])
            _draw(draw, SHAPES[kind], box, colour)
            boxes.append(box)
            labels.append(kind)
        pixels = np.asarray(image, np.float32)
        if rng.random() < 0.5:
            pixels = pixels + rng.normal(0, NOISE_SIGMA, pixels.shape)
        images[index] = np.clip(pixels, 0, 255).astype(np.uint8)
        all_boxes.append(np.stack(boxes))
        all_labels.append(np.asarray(labels, np.int64))
    return Scenes(images, all_boxes, all_labels)
