"""What the hub takes from devices' capture: who may upload, how big a sample, where it goes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from edgeagent.hub.blobs import BlobStore, S3Settings, open_store

MAX_SAMPLE_BYTES = 4 * 1024 * 1024  # a 640-px JPEG is ~100 KiB; 4 MiB is a typo or an attack


@dataclass(frozen=True)
class SamplesSettings:
    """``hub server``'s sample flags (``--device-tokens``, ``--samples-group`` …)."""

    device_tokens: Path | None = None  # "DEVICE_ID GROUP TOKEN" lines; None = no uploads
    groups: tuple[str, ...] = ()  # device groups allowed to upload ("*" = every group)
    directory: Path | None = None  # the images; None = <state_dir>/samples
    store: S3Settings | None = None  # the images in a bucket instead (--samples-store)
    max_sample_bytes: int = MAX_SAMPLE_BYTES

    def validate(self) -> None:
        if self.max_sample_bytes <= 0:
            raise ValueError("--max-sample-bytes must be positive")
        if self.groups and self.device_tokens is None:
            raise ValueError("--samples-group needs --device-tokens (each device's upload token)")
        if self.store is not None:
            if self.directory is not None:
                raise ValueError("--samples-dir and --samples-store: give one place for images")
            self.store.validate()

    def blobs(self, state_dir: Path) -> BlobStore:
        """Where the images go: the bucket, ``directory`` or ``<state_dir>/samples``."""
        return open_store(self.directory or state_dir / "samples", self.store)

    def allows(self, group: str) -> bool:
        return "*" in self.groups or group in self.groups
