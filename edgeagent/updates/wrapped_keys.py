"""The wrapped content keys of a sealed (encrypted) release's variants, installed beside them.

A device takes a sealed variant only when the signed manifest wraps its content key for this
device id (the updater refuses it as ``not_a_recipient`` otherwise, before anything is
downloaded). An installed sealed variant keeps its ciphertext and, beside it, the wrapped key
for this device (``package.WRAPPED_KEY``): useless without the device's private key, and all
``models.unsealer.Unsealer`` needs to decrypt it into memory at each load.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from edgeagent.fleet.manifest import VariantArtifact
from edgeagent.fsutil import write_file_atomic
from edgeagent.models.package import WRAPPED_KEY, sealed_dir


def install_wrapped_keys(root: Path, variants: Sequence[VariantArtifact], device_id: str) -> None:
    """Put this device's wrapped key beside each sealed variant's files in the unpacked tree."""
    for variant in variants:
        wrapped = variant.encryption.wrapped_for(device_id) if variant.encryption else None
        if wrapped is not None:
            write_file_atomic(sealed_dir(root, variant.key) / WRAPPED_KEY, wrapped, 0o600)
