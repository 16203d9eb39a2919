"""``hub sign --encrypt``: seal each variant's model files for a list of recipient devices.

Each variant gets a fresh content key; its files go into the archive encrypted, under
``sealed/<runtime>.<precision>/`` (the layout ``edgeagent.models.package`` reads), and the key
is wrapped for every recipient's X25519 public key (``edgeagent.models.seal_crypto``). The shared
files — model.toml, labels, golden inputs — stay plain: they hold no weights, and the device
must read model.toml to validate the package before it can open anything.

Recipients come from a file of device id → public key as devices report it (``hub status
--recipients FILE`` writes it from the retained state reports; ``edgeagent status --json`` →
``device_key.public_key`` shows one device's): TOML (``"dev-1" = "base64…"``) or, for a
``.json`` name, one JSON object.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

from edgeagent._toml import tomllib
from edgeagent.fleet.encryption import Encryption
from edgeagent.fleet.manifest import Targets
from edgeagent.fsutil import write_text_atomic
from edgeagent.hub.keys import HubError
from edgeagent.models.package import ModelPackage, Variant, sealed_dir
from edgeagent.models.seal_crypto import (
    SealingError,
    file_aad,
    identity,
    new_content_key,
    parse_public_key,
    seal,
    wrap_key,
)

Recipients = Mapping[str, X25519PublicKey]


def load_recipients(path: Path) -> dict[str, X25519PublicKey]:
    """Device id → public key from ``path``; HubError naming the entry that is wrong."""
    try:
        text = path.read_text(encoding="utf-8")
        table = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except OSError as exc:
        raise HubError(f"{path}: cannot read the recipients ({exc.strerror})") from exc
    except (ValueError, UnicodeDecodeError) as exc:  # TOMLDecodeError is a ValueError
        kind = "JSON" if path.suffix == ".json" else "TOML"
        raise HubError(f"{path}: not valid {kind}: {exc}") from exc
    if not isinstance(table, dict) or not table:
        raise HubError(f"{path}: must map device ids to public keys (none listed)")
    try:
        return {str(d): parse_public_key(key, f"{path}: {d}") for d, key in table.items()}
    except SealingError as exc:
        raise HubError(str(exc)) from exc


def write_recipients(path: Path, keys: Mapping[str, str]) -> None:
    """Write the recipients file ``load_recipients`` reads (TOML) from device id → key text;
    devices that reported no key (an older agent) are left out."""
    lines = ["# device id = X25519 public key, as each device reported it\n"]
    lines += [f"{json.dumps(d)} = {json.dumps(k)}\n" for d, k in sorted(keys.items()) if k]
    write_text_atomic(path, "".join(lines))


def for_targets(recipients: Recipients, targets: Targets) -> dict[str, X25519PublicKey]:
    """The recipients a release is wrapped for: its target devices when it names some (each
    must have a key), else everyone in the file."""
    if not targets.device_ids:
        return dict(recipients)
    missing = [d for d in targets.device_ids if d not in recipients]
    if missing:
        raise HubError(
            f"no public key for target device(s) {', '.join(missing)} in the recipients: "
            "they could never open the release"
        )
    return {device: recipients[device] for device in targets.device_ids}


def seal_variant(
    package: ModelPackage, variant: Variant, recipients: Recipients
) -> tuple[dict[str, bytes], Encryption]:
    """The variant's archive entries, sealed, and the wrapped content keys for the manifest."""
    key = new_content_key()
    release = identity(package.name, package.version, variant.key)
    folder = sealed_dir(package.root, variant.key).relative_to(package.root).as_posix()
    entries = {}
    for path in variant.files:
        name = path.relative_to(package.root).as_posix()
        entries[f"{folder}/{name}"] = seal(key, path.read_bytes(), file_aad(release, name))
    wrapped = {device: wrap_key(key, public, release) for device, public in recipients.items()}
    return entries, Encryption(wrapped)
