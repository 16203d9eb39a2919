"""JPEG snapshots of tracked objects, kept within a size and an age budget, sealed when the
detector is.

A sealed model's plaintext only ever exists in this device's memory; what the camera saw
through it is treated the same: each snapshot of a stream whose detector is sealed is written
as ``<name>.jpg.sealed`` = a content key wrapped to this device's own X25519 key
(``seal_crypto.wrap_key``) followed by the JPEG sealed with it (AES-256-GCM, bound to the
file's name), so only this device's key opens it (``open_snapshot``).
"""

from __future__ import annotations

import io
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from edgeagent.fsutil import write_file_atomic
from edgeagent.models import seal_crypto

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
    from PIL import Image

log = logging.getLogger(__name__)
SEALED_SUFFIX = ".sealed"


def _identity(name: str) -> bytes:
    return seal_crypto.identity("snapshot", name, "jpeg")


def seal_snapshot(jpeg: bytes, name: str, recipient: X25519PublicKey) -> bytes:
    """The sealed form of one snapshot file called ``name``."""
    key = seal_crypto.new_content_key()
    release = _identity(name)
    wrapped = seal_crypto.wrap_key(key, recipient, release)
    return wrapped + seal_crypto.seal(key, jpeg, seal_crypto.file_aad(release, name))


def open_snapshot(path: Path, private: X25519PrivateKey) -> bytes:
    """The JPEG in a sealed snapshot file (SealingError when altered or another device's)."""
    data = path.read_bytes()
    name = path.name.removesuffix(SEALED_SUFFIX)
    release = _identity(name)
    key = seal_crypto.unwrap_key(data[: seal_crypto.WRAPPED_BYTES], private, release)
    body = data[seal_crypto.WRAPPED_BYTES :]
    return seal_crypto.unseal(key, body, seal_crypto.file_aad(release, name), str(path))


class SnapshotStore:
    """A directory of snapshots; the oldest go first when over ``max_bytes`` or ``max_age_s``."""

    def __init__(
        self,
        directory: Path,
        max_bytes: int,
        max_age_s: float,
        quality: int,
        recipient: Callable[[], X25519PublicKey] | None = None,
    ) -> None:
        self.directory = directory
        self.max_bytes = max_bytes
        self.max_age_s = max_age_s
        self.quality = quality
        self.recipient = recipient  # this device's public key, for sealed snapshots
        self.removed = 0
        self._lock = threading.Lock()
        directory.mkdir(parents=True, exist_ok=True)
        found = [(p.stat().st_mtime, p, p.stat().st_size) for p in directory.glob("*.jpg*")]
        self._files: deque[tuple[float, Path, int]] = deque(sorted(found))
        self._bytes = sum(size for _, _, size in self._files)

    def save(self, name: str, image: Image.Image, sealed: bool) -> str | None:
        """Write ``image`` as ``name``.jpg (sealed when asked); its file name, or None when the
        budget is zero. Runs in a worker thread (JPEG encoding and fsync)."""
        if self.max_bytes == 0:
            return None
        buffer = io.BytesIO()
        image.save(buffer, format="JPEG", quality=self.quality)
        data, file_name = buffer.getvalue(), f"{name}.jpg"
        if sealed:
            if self.recipient is None:
                raise RuntimeError("a sealed detector's snapshot needs the device key")
            data = seal_snapshot(data, file_name, self.recipient())
            file_name += SEALED_SUFFIX
        path = self.directory / file_name
        with self._lock:
            write_file_atomic(path, data, mode=0o600)
            self._files.append((time.time(), path, len(data)))
            self._bytes += len(data)
            self._prune()
        return file_name

    def status(self) -> dict[str, int]:
        return {"files": len(self._files), "bytes": self._bytes, "removed": self.removed}

    def _prune(self) -> None:
        horizon = time.time() - self.max_age_s
        while self._files and (self._bytes > self.max_bytes or self._files[0][0] < horizon):
            _, path, size = self._files.popleft()
            path.unlink(missing_ok=True)
            self._bytes -= size
            self.removed += 1
