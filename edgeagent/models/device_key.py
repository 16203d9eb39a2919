"""The device's own X25519 key pair: what a sealed model's content key is wrapped for.

Created at first start as ``<state_dir>/device-key.pem`` (PKCS#8, mode 0600, created with
O_EXCL so two starting agents never write two keys) and reused ever after: the hub wraps
keys for the public half it collected, so a new key pair means re-collecting it. A key file
that cannot be read, is not an X25519 key, or is readable by other users is a clear error,
never silently replaced: replacing it would lock the device out of every release it holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    load_pem_private_key,
)

from edgeagent.fsutil import SecretFileError, create_file_exclusive, read_secret_file
from edgeagent.models.sealing import SCHEME, public_key_text

DEVICE_KEY_FILE = "device-key.pem"


class DeviceKeyError(RuntimeError):
    """The device key file exists but cannot be used; the message says what to do."""


@dataclass(frozen=True)
class DeviceKey:
    path: Path
    private: X25519PrivateKey

    @property
    def public_text(self) -> str:
        return public_key_text(self.private.public_key())

    def status(self) -> dict[str, Any]:
        """What /v1/status and the MQTT state report carry, for a fleet manager to collect."""
        return {"scheme": SCHEME, "public_key": self.public_text}


def open_device_key(state_dir: Path) -> DeviceKey:
    """The key pair in ``state_dir``, created on first use; DeviceKeyError if unusable."""
    path = Path(state_dir) / DEVICE_KEY_FILE
    if not path.exists():
        pem = X25519PrivateKey.generate().private_bytes(
            Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()
        )
        create_file_exclusive(path, pem, 0o600)  # a racing agent's key wins: read it below
    return _read(path)


def _read(path: Path) -> DeviceKey:
    try:
        data = read_secret_file(path)
    except SecretFileError as exc:
        raise DeviceKeyError(f"device key: {exc}") from exc
    try:
        key = load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise DeviceKeyError(
            f"{path}: not a PEM private key ({exc}); restore it from a backup, or remove it to "
            "create a new key pair (the hub must then collect the new public key)"
        ) from exc
    if not isinstance(key, X25519PrivateKey):
        raise DeviceKeyError(f"{path}: a {type(key).__name__}, not an X25519 private key")
    return DeviceKey(path, key)
