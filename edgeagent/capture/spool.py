"""The sealed spool: captured samples at rest, each one file sealed with the device key.

A sample file is ``seal(key, record JSON || "\\n" || JPEG, aad = sample id)`` with the scheme of
sealed models (``models.seal_crypto``: AES-256-GCM); the key is derived from the device's
X25519 private key (HKDF-SHA256, its own ``info``), so a copied state directory without the
device key opens nothing and a sample cannot be renamed into another. File names hold only
the capture time and a random id (``<ms>-<hex>.sample``): the time orders retention and
upload without opening anything. The spool keeps its total under ``max_bytes``: a sample that
does not fit is refused, never squeezed in by deleting another the operator has not seen.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeagent.fsutil import fsync_dir, write_file_atomic
from edgeagent.models.seal_crypto import KEY_BYTES, seal, unseal

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

SUFFIX = ".sample"
_INFO = b"edgeagent capture spool 1"


class SpoolFull(RuntimeError):
    """The sample does not fit under [capture] max_disk_mib."""


def spool_key(private: X25519PrivateKey) -> bytes:
    """The at-rest key: HKDF of the device's private key, bound to this purpose."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        NoEncryption,
        PrivateFormat,
    )

    raw = private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=_INFO).derive(raw)


def _aad(sample_id: str) -> bytes:
    return b"edgeagent-capture-1\0" + sample_id.encode("ascii")


def new_sample_id(now: float) -> str:
    return f"{int(now * 1000):013d}-{secrets.token_hex(8)}"


@dataclass(frozen=True)
class Sample:
    """One opened sample: its record (model, version, outputs …) and its JPEG bytes."""

    id: str
    record: dict[str, Any]
    image: bytes


class Spool:
    """The spool directory; thread-safe (the capture worker writes, the uploader reads)."""

    def __init__(self, directory: Path, key: Callable[[], bytes], max_bytes: int) -> None:
        self.directory = directory
        self._key = key  # read on first use: an agent that never captures never derives it
        self._max_bytes = max_bytes
        self._lock = threading.Lock()
        self._used: int | None = None

    def _path(self, sample_id: str) -> Path:
        return self.directory / f"{sample_id}{SUFFIX}"

    def ids(self) -> list[str]:
        """Every sample, oldest first."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        return sorted(n[: -len(SUFFIX)] for n in names if n.endswith(SUFFIX))

    def used_bytes(self) -> int:
        with self._lock:
            return self._usage()

    def _usage(self) -> int:
        if self._used is None:
            self._used = sum(self._size(i) for i in self.ids())
        return self._used

    def _size(self, sample_id: str) -> int:
        try:
            return self._path(sample_id).stat().st_size
        except FileNotFoundError:
            return 0

    def write(self, sample_id: str, record: dict[str, Any], image: bytes) -> int:
        """Seal and store one sample (atomically); SpoolFull when it would pass the cap."""
        plain = json.dumps(record, separators=(",", ":")).encode() + b"\n" + image
        sealed = seal(self._key(), plain, _aad(sample_id))
        with self._lock:
            if self._usage() + len(sealed) > self._max_bytes:
                raise SpoolFull(
                    f"the spool holds {self._usage()} bytes; {len(sealed)} more would pass "
                    f"[capture] max_disk_mib ({self._max_bytes} bytes)"
                )
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            write_file_atomic(self._path(sample_id), sealed, 0o600)
            self._used = self._usage() + len(sealed)
        return len(sealed)

    def read(self, sample_id: str) -> Sample:
        """The opened sample; SealingError when it was altered or sealed by another key."""
        sealed = self._path(sample_id).read_bytes()
        plain = unseal(self._key(), sealed, _aad(sample_id), f"sample {sample_id}")
        head, _, image = plain.partition(b"\n")
        return Sample(sample_id, json.loads(head), image)

    def delete(self, sample_id: str) -> bool:
        with self._lock:
            size = self._size(sample_id)
            try:
                self._path(sample_id).unlink()
            except FileNotFoundError:
                return False
            if self._used is not None:
                self._used -= size
            fsync_dir(self.directory)
            return True

    def expired(self, retention_s: float, now: float | None = None) -> list[str]:
        """Samples captured more than ``retention_s`` ago (by the time in their name)."""
        cutoff_ms = int(((now if now is not None else time.time()) - retention_s) * 1000)
        return [i for i in self.ids() if int(i.split("-", 1)[0]) < cutoff_ms]
