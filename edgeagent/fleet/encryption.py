"""The ``encryption`` object of a sealed variant in a release manifest: who can open it.

``{"scheme": "x25519-hkdf-sha256-aes256gcm", "recipients": {"<device id>": "<base64>"}}`` —
the variant's content key wrapped for each recipient device's X25519 public key
(``edgeagent.models.seal_crypto``). It travels inside the signed manifest, so the Ed25519
signature covers every wrapped key: nobody without the hub's key can add a recipient.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from edgeagent.models.names import SEAL_SCHEME as SCHEME
from edgeagent.models.seal_crypto import WRAPPED_BYTES

MAX_RECIPIENTS = 4096  # per variant; the envelope size limit binds long before this
_DEVICE_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}\Z", re.ASCII)  # as targets


@dataclass(frozen=True)
class Encryption:
    recipients: Mapping[str, bytes]  # device id → wrapped content key
    scheme: str = SCHEME

    def wrapped_for(self, device_id: str) -> bytes | None:
        return self.recipients.get(device_id)

    def to_dict(self) -> dict[str, Any]:
        return {
            "scheme": self.scheme,
            "recipients": {
                device: base64.b64encode(wrapped).decode("ascii")
                for device, wrapped in sorted(self.recipients.items())
            },
        }


def parse_encryption(value: Any, where: str) -> Encryption:
    """Validate an ``encryption`` object; ValueError with the field's path when it is not."""
    if not isinstance(value, dict) or set(value) != {"scheme", "recipients"}:
        raise ValueError(f"{where}.encryption: must be an object with scheme, recipients")
    if value["scheme"] != SCHEME:
        raise ValueError(
            f"{where}.encryption.scheme: {str(value['scheme'])[:60]!r} is not {SCHEME!r}"
        )
    recipients = value["recipients"]
    if not isinstance(recipients, dict) or not 1 <= len(recipients) <= MAX_RECIPIENTS:
        raise ValueError(
            f"{where}.encryption.recipients: must map 1-{MAX_RECIPIENTS} device ids to keys"
        )
    wrapped = {}
    for device, text in recipients.items():
        if not _DEVICE_RE.match(device):
            raise ValueError(f"{where}.encryption.recipients: {device[:60]!r} is no device id")
        try:
            raw = base64.b64decode(str(text), validate=True)
        except binascii.Error:
            raw = b""
        if len(raw) != WRAPPED_BYTES:
            raise ValueError(
                f"{where}.encryption.recipients.{device}: not a wrapped key "
                f"(base64 of {WRAPPED_BYTES} bytes)"
            )
        wrapped[device] = raw
    return Encryption(wrapped)
