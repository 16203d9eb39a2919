"""Property test of the image header reader, whose width × height the pixel budget reserves.

``open_image`` sees every upload of /classify, /detect and DeepStack before a pixel is decoded:
for any bytes (random, or a real PNG/JPEG with bytes flipped or cut) it either refuses with
``ImageError`` or returns an image within ``max_pixels``, and decoding that image either
succeeds or is an ``ImageError`` too. Anything else escaping would be a 500, or a reservation
smaller than what the decode then allocates.
"""

from __future__ import annotations

import io
import zlib

from hypothesis import example, given, settings
from hypothesis import strategies as st
from PIL import Image

from edgeagent.models.preprocess import ImageError, load_pixels, open_image

MAX_PIXELS = 64 * 64


def _encoded(kind: str) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (48, 32), (30, 90, 150)).save(buffer, format=kind)
    return buffer.getvalue()


SAMPLES = [_encoded("PNG"), _encoded("JPEG")]
# A PNG whose IHDR chunk is 5 bytes, not 13 (CRC intact): Pillow raises a bare ValueError.
_IHDR = b"IHDR" + bytes(5)
SHORT_IHDR = (
    b"\x89PNG\r\n\x1a\n" + (5).to_bytes(4, "big") + _IHDR + zlib.crc32(_IHDR).to_bytes(4, "big")
)


@st.composite
def _damaged(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(SAMPLES)))
    for _ in range(draw(st.integers(0, 8))):
        data[draw(st.integers(0, len(data) - 1))] = draw(st.integers(0, 255))
    return bytes(data[: draw(st.integers(0, len(data)))])


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=512) | _damaged())
@example(data=SHORT_IHDR)
def test_any_upload_is_an_image_within_the_limit_or_an_image_error(data: bytes) -> None:
    try:
        image = open_image(data, MAX_PIXELS)
    except ImageError:
        return
    width, height = image.size
    assert width * height <= MAX_PIXELS
    try:
        loaded = load_pixels(image)
    except ImageError:
        return
    assert loaded.size == (width, height)  # what was reserved is what was decoded
