"""Opening a sealed variant: its files decrypted into memory with the device key, never to disk.

The models layer knows the package layout (``package.sealed_dir``); the key is handed in from
the daemon, its composition root, so nothing below it reads the state directory for keys.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from edgeagent.models.device_key import DeviceKeyError
from edgeagent.models.package import (
    WRAPPED_KEY,
    ModelPackage,
    PackageError,
    Variant,
    sealed_dir,
)

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey


class SealedError(PackageError):
    """A sealed variant that does not open here: no key, a wrap for another key, tampering."""


class Unsealer:
    """Decrypts sealed variants with this device's private key (``DeviceKey.private``).

    ``private`` is called on the first sealed variant, not before: the crypto library (and
    the key file) are only loaded by an agent that holds sealed models.
    """

    def __init__(self, private: Callable[[], X25519PrivateKey]) -> None:
        self._private = private

    def contents(self, package: ModelPackage, variant: Variant) -> tuple[bytes, ...]:
        """The plaintext of each of ``variant.files``, in that order, checked against the
        SHA-256 model.toml lists for it; SealedError says which file and why it fails."""
        from edgeagent.models.seal_crypto import (
            SealingError,
            file_aad,
            identity,
            unseal,
            unwrap_key,
        )

        where = f"{package.name} {package.version} {variant.key}"
        release = identity(package.name, package.version, variant.key)
        wrapped_path = sealed_dir(package.root, variant.key) / WRAPPED_KEY
        try:
            wrapped = wrapped_path.read_bytes()
        except OSError as exc:
            raise SealedError(f"{where}: no wrapped content key ({exc.strerror})") from exc
        try:
            private = self._private()
        except DeviceKeyError as exc:
            raise SealedError(f"{where}: sealed, and this device's key is unusable: {exc}") from exc
        try:
            key = unwrap_key(wrapped, private, release)
            plain = []
            for logical, stored in zip(variant.files, variant.sealed_files, strict=True):
                name = logical.relative_to(package.root).as_posix()
                data = unseal(key, stored.read_bytes(), file_aad(release, name), name)
                expected = variant.sha256.get(logical.name)
                if expected is not None and hashlib.sha256(data).hexdigest() != expected.lower():
                    raise SealingError(f"{name}: decrypts, but not to the SHA-256 model.toml lists")
                plain.append(data)
        except SealingError as exc:
            raise SealedError(f"{where}: sealed, and does not open here: {exc}") from exc
        return tuple(plain)
