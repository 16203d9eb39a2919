"""The cryptography of sealed (encrypted) model files, in one place the hub and device share.

Scheme ``x25519-hkdf-sha256-aes256gcm`` — a well-known ECIES shape, the one age's X25519
recipients use (with AES-256-GCM for ChaCha20-Poly1305), built only from the ``cryptography``
library's primitives:

- **content**: each variant gets a fresh random 256-bit key; each of its model files is stored
  as ``MAGIC || nonce (12 random bytes) || AES-256-GCM(key, nonce, file, aad)`` where ``aad``
  is the release identity (model, version, variant) and the file's name in the package, so a
  sealed file cannot be moved to another release, variant or file and still open;
- **key wrap**, once per recipient device: an ephemeral X25519 key pair ``e``;
  ``kek = HKDF-SHA256(X25519(e, device), salt = e.pub || device.pub,
  info = "edgeagent key wrap 1" || identity)``; the wrapped key is
  ``e.pub || nonce || AES-256-GCM(kek, nonce, content key, identity)`` (92 bytes). Only the
  holder of the device's private key derives ``kek``; the identity binds the wrap to the
  release, so a wrapped key cannot be replayed onto another release's ciphertext.

Integrity of the whole is still the Ed25519-signed manifest: it pins the ciphertext archive
by SHA-256 and carries the wrapped keys, so neither can be swapped without the hub's key.
"""

from __future__ import annotations

import base64
import binascii
import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

MAGIC = b"EASEAL1\n"  # a sealed file starts with this, so a plain file is never "decrypted"
NONCE_BYTES = 12
KEY_BYTES = 32
TAG_BYTES = 16
WRAPPED_BYTES = KEY_BYTES + NONCE_BYTES + KEY_BYTES + TAG_BYTES  # e.pub, nonce, key, tag
_WRAP_INFO = b"edgeagent key wrap 1\0"


class SealingError(ValueError):
    """A sealed file or wrapped key that does not open: tampered, truncated or another key."""


def identity(model: str, version: str, variant: str) -> bytes:
    """The release identity bound into every seal and wrap (NUL-separated: names hold none)."""
    return "\0".join(("edgeagent-sealed-1", model, version, variant)).encode("utf-8")


def file_aad(release: bytes, name: str) -> bytes:
    """The associated data of one sealed file: the release identity and its package path."""
    return release + b"\0" + name.encode("utf-8")


def new_content_key() -> bytes:
    return AESGCM.generate_key(bit_length=256)


def seal(key: bytes, plaintext: bytes, aad: bytes) -> bytes:
    nonce = os.urandom(NONCE_BYTES)
    return MAGIC + nonce + AESGCM(key).encrypt(nonce, plaintext, aad)


def unseal(key: bytes, sealed: bytes, aad: bytes, what: str) -> bytes:
    """The plaintext of ``sealed``; SealingError naming ``what`` when it does not open."""
    if not sealed.startswith(MAGIC) or len(sealed) < len(MAGIC) + NONCE_BYTES + TAG_BYTES:
        raise SealingError(f"{what}: not a sealed model file (no {MAGIC[:-1].decode()} header)")
    body = sealed[len(MAGIC) :]
    try:
        return AESGCM(key).decrypt(body[:NONCE_BYTES], body[NONCE_BYTES:], aad)
    except InvalidTag as exc:
        raise SealingError(
            f"{what}: the ciphertext does not authenticate (altered, truncated, or sealed for "
            "another release)"
        ) from exc


def _raw(public: X25519PublicKey) -> bytes:
    return public.public_bytes(Encoding.Raw, PublicFormat.Raw)


def _kek(shared: bytes, ephemeral: bytes, recipient: bytes, release: bytes) -> bytes:
    return HKDF(
        algorithm=hashes.SHA256(),
        length=KEY_BYTES,
        salt=ephemeral + recipient,
        info=_WRAP_INFO + release,
    ).derive(shared)


def wrap_key(content_key: bytes, recipient: X25519PublicKey, release: bytes) -> bytes:
    """``content_key`` wrapped for ``recipient`` (see the module docstring), 92 bytes."""
    ephemeral = X25519PrivateKey.generate()
    ephemeral_raw = _raw(ephemeral.public_key())
    kek = _kek(ephemeral.exchange(recipient), ephemeral_raw, _raw(recipient), release)
    nonce = os.urandom(NONCE_BYTES)
    return ephemeral_raw + nonce + AESGCM(kek).encrypt(nonce, content_key, release)


def unwrap_key(wrapped: bytes, private: X25519PrivateKey, release: bytes) -> bytes:
    """The content key from ``wrapped``; SealingError when it was not wrapped for this key."""
    if len(wrapped) != WRAPPED_BYTES:
        raise SealingError(f"a wrapped key is {WRAPPED_BYTES} bytes, this one {len(wrapped)}")
    ephemeral_raw = wrapped[:KEY_BYTES]
    nonce = wrapped[KEY_BYTES : KEY_BYTES + NONCE_BYTES]
    try:
        shared = private.exchange(X25519PublicKey.from_public_bytes(ephemeral_raw))
        kek = _kek(shared, ephemeral_raw, _raw(private.public_key()), release)
        return AESGCM(kek).decrypt(nonce, wrapped[KEY_BYTES + NONCE_BYTES :], release)
    except (InvalidTag, ValueError) as exc:
        raise SealingError(
            "the content key was not wrapped for this device's key (was the device key "
            "replaced after the hub collected it?) or the wrap belongs to another release"
        ) from exc


def public_key_text(public: X25519PublicKey) -> str:
    """How a device reports its public key and a recipients file lists it: base64 of 32 bytes."""
    return base64.b64encode(_raw(public)).decode("ascii")


def parse_public_key(text: object, where: str) -> X25519PublicKey:
    """A public key from its text; SealingError naming ``where`` when it is not one."""
    try:
        raw = base64.b64decode(str(text), validate=True)
        if len(raw) != KEY_BYTES:
            raise ValueError(f"{len(raw)} bytes, not {KEY_BYTES}")
        return X25519PublicKey.from_public_bytes(raw)
    except (binascii.Error, ValueError) as exc:
        raise SealingError(
            f"{where}: {str(text)[:60]!r} is not an X25519 public key (base64 of 32 bytes): {exc}"
        ) from exc
