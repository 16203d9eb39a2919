"""The device's own X25519 key pair: what a sealed model's content key is wrapped for.

Created at first start as ``<state_dir>/device-key.pem`` (PKCS#8, mode 0600, created with
O_EXCL so two starting agents never write two keys) and reused ever after: the hub wraps
keys for the public half it collected, so a new key pair means re-collecting it. A key file
that cannot be read, is not an X25519 key, or is readable by other users is a clear error,
never silently replaced: replacing it would lock the device out of every release it holds.

The public half is kept beside it in ``device-key.pub`` (base64, what the agent reports), so
an agent that never opens a sealed model never loads ``cryptography`` (7 MB of its idle RSS):
the private key is read on first use, and checked then against the public half reported.
"""

from __future__ import annotations

import base64
import binascii
import logging
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from edgeagent.fsutil import (
    SecretFileError,
    create_file_exclusive,
    read_secret_file,
    write_text_atomic,
)
from edgeagent.models.package import SEAL_SCHEME

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

DEVICE_KEY_FILE = "device-key.pem"
PUBLIC_KEY_FILE = "device-key.pub"

log = logging.getLogger(__name__)


class DeviceKeyError(RuntimeError):
    """The device key file exists but cannot be used; the message says what to do."""


class DeviceKey:
    """The key pair in a state directory: the public half at hand, the private one on use."""

    def __init__(self, path: Path, public_text: str) -> None:
        self.path = path
        self.public_text = public_text

    @cached_property
    def private(self) -> X25519PrivateKey:
        """The private key, read once; DeviceKeyError when it is unusable or is not the key
        whose public half this agent has been reporting."""
        key = _load_private(self.path)
        derived = _public_text(key)
        if derived != self.public_text:
            raise DeviceKeyError(
                f"{self.path.with_name(PUBLIC_KEY_FILE)} does not hold the public half of "
                f"{self.path}; remove it and restart the agent, then collect the key again "
                "(hub status --recipients)"
            )
        return key

    def status(self) -> dict[str, Any]:
        """What /v1/status and the MQTT state report carry, for a fleet manager to collect."""
        return {"scheme": SEAL_SCHEME, "public_key": self.public_text}


def open_device_key(state_dir: Path) -> DeviceKey:
    """The key pair in ``state_dir``, created on first use; DeviceKeyError if unusable."""
    path = Path(state_dir) / DEVICE_KEY_FILE
    created = not path.exists()
    if created:
        _create(path)  # a racing agent's key wins: it is read below
    try:
        read_secret_file(path)  # its permissions, checked on every start
    except SecretFileError as exc:
        raise DeviceKeyError(f"device key: {exc}") from exc
    # A new pair never reports a public half left by the pair it replaces.
    public = None if created else _read_public(path.with_name(PUBLIC_KEY_FILE))
    if public is None:  # new, an older state directory, or a removed file: derive it
        public = _public_text(_load_private(path))
        write_text_atomic(path.with_name(PUBLIC_KEY_FILE), public + "\n")
    return DeviceKey(path, public)


def _create(path: Path) -> None:
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
    from cryptography.hazmat.primitives.serialization import (
        Encoding,
        NoEncryption,
        PrivateFormat,
    )

    pem = X25519PrivateKey.generate().private_bytes(
        Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()
    )
    create_file_exclusive(path, pem, 0o600)


def _read_public(path: Path) -> str | None:
    """The stored public half, or None (and a warning) when it is missing or malformed."""
    try:
        text = path.read_text(encoding="ascii").strip()
        if len(base64.b64decode(text, validate=True)) == 32:
            return text
        log.warning("%s does not hold 32 bytes of base64; deriving it again", path)
    except FileNotFoundError:
        pass
    except (OSError, UnicodeDecodeError, binascii.Error) as exc:
        log.warning("%s is unreadable (%s); deriving it again", path, exc)
    return None


def _load_private(path: Path) -> X25519PrivateKey:
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

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
    return key


def _public_text(private: X25519PrivateKey) -> str:
    from edgeagent.models.seal_crypto import public_key_text

    return public_key_text(private.public_key())
