"""Preprocessing checked against values computed by hand."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from edgeagent.models.package import Preprocess
from edgeagent.models.preprocess import (
    ImageError,
    decode_image,
    preprocess_image,
    resize_and_crop,
    softmax,
    top_k,
)


def _encode(image: Image.Image, fmt: str) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt)
    return buffer.getvalue()


def _spec(**changes) -> Preprocess:
    base = dict(
        size=(2, 2),
        resize=None,
        layout="NCHW",
        color="RGB",
        scale=1 / 255,
        mean=(0.5, 0.5, 0.5),
        std=(0.25, 0.25, 0.25),
    )
    base.update(changes)
    return Preprocess(**base)


def test_png_pixels_normalised_by_hand() -> None:
    image = Image.new("RGB", (2, 2))
    image.putdata([(255, 0, 51), (0, 255, 102), (255, 255, 255), (0, 0, 0)])
    tensor = preprocess_image(_encode(image, "PNG"), _spec())
    assert tensor.shape == (1, 3, 2, 2) and tensor.dtype == np.float32
    # red channel of the first pixel: (255/255 - 0.5) / 0.25 = 2.0; blue: (51/255 - .5)/.25 = -1.2
    assert tensor[0, 0, 0, 0] == pytest.approx(2.0)
    assert tensor[0, 2, 0, 0] == pytest.approx(-1.2)
    assert tensor[0, 1, 1, 1] == pytest.approx(-2.0)


def test_nhwc_and_bgr_layouts() -> None:
    image = Image.new("RGB", (2, 2), (255, 0, 0))
    tensor = preprocess_image(_encode(image, "PNG"), _spec(layout="NHWC", color="BGR"))
    assert tensor.shape == (1, 2, 2, 3)
    assert tensor[0, 0, 0, 2] == pytest.approx(2.0)  # red is the last channel in BGR
    assert tensor[0, 0, 0, 0] == pytest.approx(-2.0)


def test_grey_input_has_one_channel() -> None:
    image = Image.new("L", (4, 4), 255)
    spec = _spec(color="L", mean=(0.0,), std=(1.0,), size=(4, 4))
    tensor = preprocess_image(_encode(image, "PNG"), spec)
    assert tensor.shape == (1, 1, 4, 4)
    assert np.allclose(tensor, 1.0)


def test_shorter_side_resize_then_centre_crop() -> None:
    # 8×4 image: left half black, right half white; resize shorter side to 4 → unchanged, crop 4×4
    image = Image.new("L", (8, 4), 0)
    image.paste(255, (4, 0, 8, 4))
    cropped = resize_and_crop(image, _spec(size=(4, 4), resize=4))
    assert cropped.size == (4, 4)
    columns = np.asarray(cropped)[0]
    assert list(columns) == [0, 0, 255, 255]  # the centre straddles the edge


def test_jpeg_decodes() -> None:
    data = _encode(Image.new("RGB", (32, 24), (10, 200, 30)), "JPEG")
    assert decode_image(data).size == (32, 24)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "empty body"),
        (b"hello, not an image", "not a JPEG or PNG"),
        (_encode(Image.new("RGB", (4, 4)), "GIF"), "GIF images are not accepted"),
    ],
)
def test_non_images_are_refused(data: bytes, message: str) -> None:
    with pytest.raises(ImageError, match=message):
        decode_image(data)


def test_truncated_and_oversized_images() -> None:
    data = _encode(Image.new("RGB", (64, 64), (1, 2, 3)), "PNG")
    with pytest.raises(ImageError, match="corrupt PNG"):
        decode_image(data[: len(data) // 2])
    with pytest.raises(ImageError, match="exceeds the limit"):
        decode_image(data, max_pixels=100)


def test_softmax_and_top_k() -> None:
    logits = np.array([1.0, 3.0, 2.0, 0.0], dtype=np.float32)
    probabilities = softmax(logits)
    assert probabilities.sum() == pytest.approx(1.0)
    best = top_k(logits, ("a", "b", "c", "d"), 2, apply_softmax=True)
    assert [p.label for p in best] == ["b", "c"]
    assert best[0].score == pytest.approx(np.exp(3) / np.exp([1, 3, 2, 0]).sum())
    assert [p.index for p in top_k(logits, (), 10, apply_softmax=False)] == [1, 2, 0, 3]
