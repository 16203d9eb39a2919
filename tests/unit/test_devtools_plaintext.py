"""The privacy check's detector: an image in the clear is found wherever it sits in a file;
a JPEG's three signature bytes turning up in random (sealed) bytes are not an image."""

from __future__ import annotations

import io
import os
from pathlib import Path

from PIL import Image

from devtools.plaintext import holds_image, plaintext_images


def _encoded(kind: str) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (24, 16), (200, 30, 90)).save(out, kind)
    return out.getvalue()


def test_an_image_is_found_at_any_offset_and_a_lone_signature_is_not(tmp_path: Path) -> None:
    noise = os.urandom(4096)
    (tmp_path / "inside").write_bytes(b'{"record": 1}\n' + _encoded("JPEG") + noise)
    (tmp_path / "png").write_bytes(noise + _encoded("PNG"))
    (tmp_path / "sealed").write_bytes(noise[:100] + b"\xff\xd8\xff\xe0" + noise[100:])
    (tmp_path / "cut").write_bytes(b"\x89PNG\r\n\x1a\n" + noise[:50])
    assert plaintext_images(tmp_path) == ["inside", "png"]
    assert not holds_image(b"")
