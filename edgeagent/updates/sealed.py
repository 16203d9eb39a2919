"""The updater's part in sealed (encrypted) releases: who may take one, and its wrapped keys.

A device takes a sealed variant only when the signed manifest wraps its content key for this
device id; otherwise the release is refused as ``not_a_recipient`` before anything is
downloaded. An installed sealed variant keeps its ciphertext and, beside it, the wrapped key
for this device (``package.WRAPPED_KEY``): useless without the device's private key, and all
``models.sealed.Unsealer`` needs to decrypt it into memory at each load.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from edgeagent.fleet import outcomes
from edgeagent.fleet.manifest import ReleaseManifest, VariantArtifact
from edgeagent.fleet.signing import TrustError
from edgeagent.fsutil import write_file_atomic
from edgeagent.models.package import WRAPPED_KEY, sealed_dir


def recipient_refusal(
    manifest: ReleaseManifest, variants: Sequence[VariantArtifact], device_id: str
) -> TrustError | None:
    """``not_a_recipient`` when a chosen variant is sealed but not for ``device_id``."""
    locked = [
        v.key
        for v in variants
        if v.encryption is not None and v.encryption.wrapped_for(device_id) is None
    ]
    if not locked:
        return None
    return TrustError(
        outcomes.NOT_A_RECIPIENT,
        f"{manifest.model} {manifest.version}: variant(s) {', '.join(locked)} are encrypted, "
        f"and no content key is wrapped for device {device_id!r} (the hub must collect its "
        "public key and sign the release with it among the --recipients)",
    )


def install_wrapped_keys(root: Path, variants: Sequence[VariantArtifact], device_id: str) -> None:
    """Put this device's wrapped key beside each sealed variant's files in the unpacked tree."""
    for variant in variants:
        wrapped = variant.encryption.wrapped_for(device_id) if variant.encryption else None
        if wrapped is not None:
            write_file_atomic(sealed_dir(root, variant.key) / WRAPPED_KEY, wrapped, 0o600)
