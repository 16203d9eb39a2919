"""Images kept in the clear under a directory: what capture's privacy promise forbids.

A file counts when, at any offset, a JPEG or PNG begins that Pillow decodes completely. The
signature alone is not evidence: a sealed sample is random bytes, and in a few kilobytes of
them the three bytes of a JPEG's start turn up by chance about once in three thousand files
(a capture run with a hundred samples then "found" a plaintext image now and then). An image
hidden inside another file (a record, a log) is still found.
"""

from __future__ import annotations

import io
from pathlib import Path

from PIL import Image

SIGNATURES = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n")


def decodes_at(data: bytes, offset: int) -> bool:
    try:
        with Image.open(io.BytesIO(data[offset:])) as image:
            image.load()
    except Exception:  # Pillow raises many kinds on garbage (SyntaxError, OSError, struct.error…)
        return False
    return True


def holds_image(data: bytes) -> bool:
    """Whether a decodable JPEG or PNG starts anywhere in ``data``."""
    for signature in SIGNATURES:
        offset = data.find(signature)
        while offset >= 0:
            if decodes_at(data, offset):
                return True
            offset = data.find(signature, offset + 1)
    return False


def plaintext_images(root: Path) -> list[str]:
    """Files under ``root`` (relative paths) that hold an image in the clear."""
    return sorted(
        str(path.relative_to(root))
        for path in root.rglob("*")
        if path.is_file() and not path.is_symlink() and holds_image(path.read_bytes())
    )
