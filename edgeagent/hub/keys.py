"""Hub keys and trust files: ``hub keygen`` and ``hub rotate``.

Two roles, as on the device: *root* keys sign trust files (keep them offline), *release* keys
sign release manifests (the day-to-day key), and optional *agent* keys sign agent releases
(code, so never the model key: ``hub keygen --agent-keys``). Private keys are PEM (PKCS#8,
optionally encrypted with a passphrase) created with mode 0600 and never overwritten; public
keys are PEM too. Every trust file this module writes is first checked with the device's own
``TrustStore`` code, so the hub cannot hand out a trust file or rotation that devices would
refuse.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from edgeagent.fleet.signing import (
    TrustError,
    format_time,
    keyid_of,
    raw_public_bytes,
    sign_envelope,
)
from edgeagent.fleet.trust import TrustStore, parse_trust
from edgeagent.fsutil import SecretFileError, read_secret_file, write_file_atomic

DEFAULT_TRUST_LIFETIME = timedelta(days=365)


class HubError(Exception):
    """A hub command that cannot go on; the message names the file and what to do about it."""


@dataclass(frozen=True)
class KeyPair:
    name: str
    key_path: Path
    pub_path: Path
    keyid: str


@dataclass(frozen=True)
class KeygenResult:
    keys: tuple[KeyPair, ...]
    trust_path: Path
    version: int
    expires: datetime


def generate_key(directory: str | Path, name: str, *, passphrase: bytes | None = None) -> KeyPair:
    """Create ``<name>.key`` (PEM, mode 0600) and ``<name>.pub``; refuse to overwrite either."""
    directory = Path(directory)
    if not name or "/" in name or name.startswith("."):
        raise HubError(f"key name {name!r} must be a plain file name")
    key_path, pub_path = directory / f"{name}.key", directory / f"{name}.pub"
    for path in (key_path, pub_path):
        if path.exists():
            raise HubError(f"{path} already exists; refusing to overwrite a key (pick a new name)")
    directory.mkdir(parents=True, exist_ok=True)
    key = Ed25519PrivateKey.generate()
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(passphrase)
        if passphrase
        else serialization.NoEncryption()
    )
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
    )
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(pem)
        handle.flush()
        os.fsync(handle.fileno())
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    write_file_atomic(pub_path, public)
    return KeyPair(name, key_path, pub_path, keyid_of(key.public_key()))


def load_private_key(path: str | Path, passphrase: bytes | None = None) -> Ed25519PrivateKey:
    """Read a ``.key`` file; refuse one that others can read, is not Ed25519 or is locked."""
    path = Path(path)
    try:
        data = read_secret_file(path)
    except SecretFileError as exc:
        raise HubError(f"private key: {exc}") from exc
    try:
        key = serialization.load_pem_private_key(data, password=passphrase)
    except TypeError as exc:
        hint = "it is encrypted: give its passphrase" if passphrase is None else "it has none"
        raise HubError(f"{path}: {hint}") from exc
    except ValueError as exc:
        raise HubError(f"{path}: not a readable PEM private key or wrong passphrase") from exc
    return _ed25519(key, Ed25519PrivateKey, path)


def load_public_key(path: str | Path) -> Ed25519PublicKey:
    """Read a ``.pub`` file (PEM SubjectPublicKeyInfo) holding an Ed25519 key."""
    path = Path(path)
    try:
        key = serialization.load_pem_public_key(path.read_bytes())
    except OSError as exc:
        raise HubError(f"{path}: cannot read public key ({exc.strerror})") from exc
    except ValueError as exc:
        raise HubError(f"{path}: not a PEM public key") from exc
    return _ed25519(key, Ed25519PublicKey, path)


def _ed25519(key: object, kind: Any, path: Path) -> Any:
    """Only Ed25519 is accepted: devices verify nothing else (no algorithm agility to abuse)."""
    if not isinstance(key, kind):
        raise HubError(f"{path}: is a {type(key).__name__}, an Ed25519 key is needed")
    return key


def trust_payload(
    *,
    version: int,
    expires: datetime,
    root: Sequence[Ed25519PublicKey],
    release: Sequence[Ed25519PublicKey],
    root_threshold: int = 1,
    release_threshold: int = 1,
    floor_resets: Mapping[str, str] | None = None,
    agent: Sequence[Ed25519PublicKey] = (),
    agent_threshold: int = 1,
) -> bytes:
    """The canonical bytes of a trust file's payload (validated with the device's parser).

    ``floor_resets`` ({model: version}) is the root keys' way out of a leaked release key
    (see ``fleet.trust``): devices set those anti-rollback floors to exactly these versions.
    """
    keys = {keyid_of(k): {"ed25519": raw_public_bytes(k).hex()} for k in (*root, *release, *agent)}
    roles: dict[str, Any] = {
        "root": {"keyids": sorted({keyid_of(k) for k in root}), "threshold": root_threshold},
        "release": {
            "keyids": sorted({keyid_of(k) for k in release}),
            "threshold": release_threshold,
        },
    }
    document = {
        "type": "trust",
        "version": version,
        "expires": format_time(expires),
        "keys": dict(sorted(keys.items())),
        "roles": roles,
    }
    if floor_resets:
        document["floor_resets"] = dict(sorted(floor_resets.items()))
    if agent:  # the optional role (fleet.trust.OPTIONAL_ROLES): without it, no agent release
        roles["agent"] = {
            "keyids": sorted({keyid_of(k) for k in agent}),
            "threshold": agent_threshold,
        }
    payload = json.dumps(document, sort_keys=True, separators=(",", ":")).encode("utf-8")
    try:
        parse_trust(payload)
    except TrustError as exc:
        raise HubError(f"cannot build trust v{version}: {exc.message}") from exc
    return payload


def _names(role: str, count: int) -> list[str]:
    return [role] if count == 1 else [f"{role}-{i}" for i in range(1, count + 1)]


def keygen(
    directory: str | Path,
    *,
    root_keys: int = 1,
    release_keys: int = 1,
    root_threshold: int = 1,
    release_threshold: int = 1,
    expires_in: timedelta = DEFAULT_TRUST_LIFETIME,
    passphrase: bytes | None = None,
    now: datetime | None = None,
    agent_keys: int = 0,
) -> KeygenResult:
    """Create root and release key pairs in ``directory`` and the initial ``trust.json`` (v1);
    with ``agent_keys``, that many agent keys too (``agent.key``: signs agent releases).

    ``trust.json`` is what devices are provisioned with ([updates] trust_file).
    """
    directory = Path(directory)
    trust_path = directory / "trust.json"
    if trust_path.exists():
        raise HubError(f"{trust_path} already exists; use 'hub rotate' to change the trust")
    for count, role in ((root_keys, "root"), (release_keys, "release")):
        if count < 1:
            raise HubError(f"at least one {role} key is needed")
    expires = (now or datetime.now(timezone.utc)) + expires_in
    root_names, release_names = _names("root", root_keys), _names("release", release_keys)
    agent_names = _names("agent", agent_keys) if agent_keys > 0 else []
    for name in (*root_names, *release_names, *agent_names):
        for suffix in (".key", ".pub"):
            if (directory / f"{name}{suffix}").exists():
                raise HubError(
                    f"{directory / (name + suffix)} already exists; refusing to overwrite"
                )
    pairs = [
        generate_key(directory, n, passphrase=passphrase)
        for n in (*root_names, *release_names, *agent_names)
    ]
    private = [load_private_key(p.key_path, passphrase) for p in pairs]
    root, release = private[:root_keys], private[root_keys : root_keys + release_keys]
    agent = private[root_keys + release_keys :]
    payload = trust_payload(
        version=1,
        expires=expires,
        root=[k.public_key() for k in root],
        release=[k.public_key() for k in release],
        root_threshold=root_threshold,
        release_threshold=release_threshold,
        agent=[k.public_key() for k in agent],
    )
    envelope = sign_envelope(payload, root)
    _device_check(envelope)
    write_file_atomic(trust_path, envelope)
    return KeygenResult(tuple(pairs), trust_path, 1, expires)


def rotate(
    trust_path: str | Path,
    *,
    old_root_keys: Sequence[str | Path],
    new_root_keys: Sequence[str | Path] = (),
    release_pubs: Sequence[str | Path] = (),
    root_threshold: int | None = None,
    release_threshold: int | None = None,
    expires_in: timedelta = DEFAULT_TRUST_LIFETIME,
    out_path: str | Path | None = None,
    passphrase: bytes | None = None,
    now: datetime | None = None,
    floor_resets: Mapping[str, str] | None = None,
) -> Path:
    """Write trust N+1 (default: over ``trust_path``) signed by the old *and* new root keys.

    A copy is kept as ``trust.v<N+1>.json`` beside the output, for ``trust_chain``.

    ``new_root_keys`` (private, they must sign) replace the root role and ``release_pubs``
    the release role; either left empty keeps the current keys of that role. Thresholds default
    to the current ones. The result is checked by rotating a scratch copy of trust N with the
    device's code, so a rotation the fleet would refuse is never written.
    """
    trust_path = Path(trust_path)
    try:
        current = TrustStore.load(trust_path)
    except TrustError as exc:
        raise HubError(f"current trust: {exc.message}") from exc
    old = [load_private_key(p, passphrase) for p in old_root_keys]
    if not old:
        raise HubError("rotation needs the current root key(s) (--root-key)")
    new_private = [load_private_key(p, passphrase) for p in new_root_keys]
    old_root_ids = current.root.roles["root"].keyids
    root = (
        [k.public_key() for k in new_private]
        if new_private
        else [current.root.keys[k] for k in sorted(old_root_ids)]
    )
    release = (
        [load_public_key(p) for p in release_pubs]
        if release_pubs
        else [current.root.keys[k] for k in sorted(current.root.roles["release"].keyids)]
    )
    moment = now or datetime.now(timezone.utc)
    version = current.version + 1
    payload = trust_payload(
        version=version,
        expires=moment + expires_in,
        root=root,
        release=release,
        root_threshold=root_threshold or current.root.roles["root"].threshold,
        release_threshold=release_threshold or current.root.roles["release"].threshold,
        floor_resets=floor_resets,
        **_kept_agent_role(current),
    )
    envelope = sign_envelope(payload, [*old, *new_private])
    _device_check(trust_path.read_bytes(), lambda store: store.rotate(envelope, now=moment))
    target = Path(out_path) if out_path is not None else trust_path
    write_file_atomic(target.with_name(f"trust.v{version}.json"), envelope)
    write_file_atomic(target, envelope)
    return target


def _kept_agent_role(current: TrustStore) -> dict[str, Any]:
    """The agent role of trust N, carried into N+1 unchanged (a rotation of the root or release
    keys must not silently stop the fleet from taking agent releases)."""
    role = current.root.roles.get("agent")
    if role is None:
        return {}
    return {
        "agent": [current.root.keys[k] for k in sorted(role.keyids)],
        "agent_threshold": role.threshold,
    }


def trust_chain(trust_path: str | Path, *, after: int = 1) -> bytes:
    """Every rotation archived next to ``trust_path`` (``trust.v<N>.json``, N > ``after``) as one
    message, oldest first: what ``TrustStore.update`` on a device walks one version at a time,
    so a device that slept through several rotations still catches up from one retained message.
    """
    directory = Path(trust_path).parent
    versions = []
    for path in directory.glob("trust.v*.json"):
        number = path.name[len("trust.v") : -len(".json")]
        if number.isdigit() and int(number) > after:
            versions.append((int(number), json.loads(path.read_bytes())))
    if not versions:
        raise HubError(f"{directory}: no rotated trust files (trust.v<N>.json) after v{after}")
    return json.dumps([document for _, document in sorted(versions, key=lambda v: v[0])]).encode()


def _device_check(trust: bytes, then: Callable[[TrustStore], object] | None = None) -> None:
    """Load ``trust`` as a device would (scratch copy), then run ``then`` on it; TrustError →
    HubError, so the hub never writes a trust file the fleet would refuse."""
    with tempfile.TemporaryDirectory(prefix="edgeagent-hub-") as scratch:
        path = Path(scratch) / "trust.json"
        path.write_bytes(trust)
        try:
            store = TrustStore.load(path)
            if then is not None:
                then(store)
        except TrustError as exc:
            raise HubError(f"devices would refuse this trust file: {exc}") from exc
