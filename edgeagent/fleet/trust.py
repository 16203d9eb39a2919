"""The device's trust store: which hub keys may sign what, rotated only by signed successors.

The trust file is an envelope (see ``signing``) whose payload names the keys and two roles:
``root`` signs trust files, ``release`` signs release manifests, each with a threshold; an
optional third, ``agent``, signs agent releases (code: the agent itself, ``selfupdate``), so a
model release key can never ship code, and a trust file without it takes no agent release. Like
TUF's root metadata, trust N+1 is accepted only when a threshold of N's root keys *and* a
threshold of N+1's own root keys signed it, its version is exactly N+1 and it has not expired;
versions only go up, so an old trust file (with keys since revoked) cannot be replayed.

The store also keeps the *verified time*: the newest ``issued_at`` of any release it accepted.
A device clock behind it is treated as that time, so a dead RTC or a spoofed NTP cannot revive
expired manifests (TUF's "never accept a clock earlier than the last verified time").

A trust file may carry ``floor_resets`` ({model: version}): the way out of a leaked release
key. Whoever holds that key can sign an absurdly high version, after which every genuine
release is ``rollback`` for ever; the root keys (offline, not leaked) sign a rotation that
revokes the key *and* resets those floors, and the device applies both together.

Every change on disk is written to a temporary file, fsynced and renamed, so a power cut leaves
the old file or the new one, never half of each.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from edgeagent.fleet import outcomes
from edgeagent.fleet.limits import MAX_ENVELOPE_BYTES
from edgeagent.fleet.signing import (
    Refused,
    TrustError,
    VerificationError,
    check_threshold,
    decode_envelope,
    format_time,
    keyid_of,
    loads_strict,
    parse_time,
    public_key_from_hex,
)
from edgeagent.fsutil import write_file_atomic
from edgeagent.models.names import NAME_RE, VERSION_RE

ROLES = ("root", "release")
OPTIONAL_ROLES = ("agent",)  # absent: nobody may sign that kind of release
MAX_FLOOR_RESETS = 256  # models one rotation may reset
MAX_CHAIN = 32  # trust versions one message may carry (a device offline across many rotations)


@dataclass(frozen=True)
class Role:
    keyids: frozenset[str]
    threshold: int


@dataclass(frozen=True)
class TrustRoot:
    """A parsed, self-consistent trust payload (keys and roles), not yet tied to a file."""

    version: int
    expires: datetime
    keys: Mapping[str, Ed25519PublicKey]
    roles: Mapping[str, Role]
    floor_resets: Mapping[str, str] = field(default_factory=dict)  # {model: version}


def _fail(where: str, problem: str) -> VerificationError:
    return VerificationError(outcomes.MALFORMED, f"trust {where}: {problem}")


def _exact_keys(value: Any, expected: set[str], where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _fail(where, "must be an object")
    if set(value) != expected:
        missing = ", ".join(sorted(expected - set(value))) or "-"
        extra = ", ".join(sorted(set(value) - expected)) or "-"
        raise _fail(
            where, f"fields must be {sorted(expected)} (missing: {missing}; extra: {extra})"
        )
    return value


def _int(value: Any, where: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _fail(where, f"must be an integer >= {minimum}, got {value!r}")
    return value


def parse_trust(payload: bytes) -> TrustRoot:
    """Validate a trust payload completely; only call it on signature-checked bytes."""
    parsed = loads_strict(payload, "trust payload")
    optional = {"floor_resets"} & set(parsed) if isinstance(parsed, dict) else set()
    document = _exact_keys(
        parsed, {"type", "version", "expires", "keys", "roles", *optional}, "payload"
    )
    if document["type"] != "trust":
        raise _fail("type", f"must be 'trust', got {document['type']!r}")
    version = _int(document["version"], "version", 1)
    expires = parse_time(document["expires"], "trust expires")
    raw_keys = document["keys"]
    if not isinstance(raw_keys, dict) or not raw_keys:
        raise _fail("keys", "must be a non-empty object of key id -> {ed25519: hex}")
    keys: dict[str, Ed25519PublicKey] = {}
    for keyid, entry in raw_keys.items():
        where = f"keys.{keyid[:16]}"
        key = public_key_from_hex(_exact_keys(entry, {"ed25519"}, where)["ed25519"], where)
        if keyid_of(key) != keyid:
            raise _fail(where, "key id is not the SHA-256 of its public key")
        keys[keyid] = key
    present = (
        set(document["roles"]) & set(OPTIONAL_ROLES)
        if isinstance(document["roles"], dict)
        else set()
    )
    raw_roles = _exact_keys(document["roles"], {*ROLES, *present}, "roles")
    roles = {}
    for name in (*ROLES, *sorted(present)):
        entry = _exact_keys(raw_roles[name], {"keyids", "threshold"}, f"roles.{name}")
        keyids = entry["keyids"]
        if not isinstance(keyids, list) or not keyids or len(set(keyids)) != len(keyids):
            raise _fail(f"roles.{name}.keyids", "must be a non-empty list of distinct key ids")
        strangers = [k for k in keyids if k not in keys]
        if strangers:
            raise _fail(f"roles.{name}.keyids", f"{strangers[0]!r} is not listed under keys")
        threshold = _int(entry["threshold"], f"roles.{name}.threshold", 1)
        if threshold > len(keyids):
            raise _fail(
                f"roles.{name}.threshold", f"{threshold} is more than its {len(keyids)} keys"
            )
        roles[name] = Role(frozenset(keyids), threshold)
    return TrustRoot(
        version=version,
        expires=expires,
        keys=keys,
        roles=roles,
        floor_resets=_floor_resets(document.get("floor_resets", {})),
    )


def _floor_resets(value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or len(value) > MAX_FLOOR_RESETS:
        raise _fail("floor_resets", f"must be an object of at most {MAX_FLOOR_RESETS} entries")
    for model, version in value.items():
        if (
            not NAME_RE.match(model)
            or not isinstance(version, str)
            or not VERSION_RE.match(version)
        ):
            raise _fail(
                "floor_resets", f"{model[:64]!r}: must map a model name to a version string"
            )
    return dict(value)


def _self_verified(data: bytes, source: Path | str, max_bytes: int) -> TrustRoot:
    """Parse a trust file that must carry a threshold of its *own* root keys' signatures."""
    try:
        envelope = decode_envelope(data, max_bytes=max_bytes, what="trust file")
        root = parse_trust(envelope.payload)
        role = root.roles["root"]
        check_threshold(
            envelope, keys=root.keys, authorised=role.keyids, threshold=role.threshold, role="root"
        )
    except TrustError as exc:
        raise type(exc)(exc.code, f"{source}: {exc.message}") from exc
    return root


class TrustStore:
    """The trusted keys of this device, persisted at ``path``, plus the verified time."""

    def __init__(
        self,
        path: Path,
        root: TrustRoot,
        *,
        max_bytes: int,
        floor_resets: Mapping[str, str] | None = None,
    ) -> None:
        self.path = path
        self.root = root
        self.max_bytes = max_bytes
        # The floor resets carried by the rotation(s) that produced this object, for the
        # updater to apply; a store loaded from disk has none (they were applied before).
        self.floor_resets: Mapping[str, str] = dict(floor_resets or {})

    @classmethod
    def load(
        cls,
        path: str | Path,
        *,
        seed: str | Path | None = None,
        max_bytes: int = MAX_ENVELOPE_BYTES,
    ) -> TrustStore:
        """Open the trust file at ``path`` (which rotations rewrite).

        ``seed`` is the provisioned trust file (e.g. ``/etc/edgeagent/trust.json``, read-only
        under systemd): it initialises ``path`` on first start, and replaces it when an operator
        provisions a higher version by hand. Both must be signed by their own root keys.
        """
        path = Path(path)
        root = None
        if path.exists():
            root = _self_verified(_read(path, max_bytes), path, max_bytes)
        if seed is not None and Path(seed).exists():
            seed_bytes = _read(Path(seed), max_bytes)
            seeded = _self_verified(seed_bytes, seed, max_bytes)
            if root is None or seeded.version > root.version:
                write_file_atomic(path, seed_bytes)
                root = seeded
        if root is None:
            where = f"{path}" + (f" or {seed}" if seed is not None else "")
            raise TrustError(
                outcomes.NO_TRUST, f"no trust file at {where}; provision one (hub keygen)"
            )
        return cls(path, root, max_bytes=max_bytes)

    @property
    def version(self) -> int:
        return self.root.version

    @property
    def expires(self) -> datetime:
        return self.root.expires

    def verify(self, envelope: bytes, role: str = "release") -> bytes:
        """Return the payload of ``envelope`` once a threshold of ``role``'s keys signed it."""
        if role not in (*ROLES, *OPTIONAL_ROLES):
            raise ValueError(
                f"unknown role {role!r}; roles are {', '.join(ROLES + OPTIONAL_ROLES)}"
            )
        if role not in self.root.roles:
            raise VerificationError(
                outcomes.NO_ROLE,
                f"trust v{self.version} names no {role!r} keys, so nothing signed for that role "
                "is accepted; rotate to a trust file that has them (hub keygen --agent-keys)",
            )
        decoded = decode_envelope(envelope, max_bytes=self.max_bytes, what=f"{role} envelope")
        spec = self.root.roles[role]
        check_threshold(
            decoded,
            keys=self.root.keys,
            authorised=spec.keyids,
            threshold=spec.threshold,
            role=role,
        )
        return decoded.payload

    def rotate(self, new_trust_envelope: bytes, *, now: datetime | None = None) -> TrustStore:
        """Accept trust N+1 and persist it atomically; return the store that uses it.

        Refused (nothing written) unless a threshold of the current root keys and a threshold
        of the new root keys signed it, its version is exactly N+1 and it has not expired.
        """
        return self._apply([new_trust_envelope], now)

    def _successor(self, new_trust_envelope: bytes, moment: datetime) -> TrustStore:
        """Verify trust N+1 against this store, in memory only (nothing is written)."""
        old_root = self.root.roles["root"]
        envelope = decode_envelope(new_trust_envelope, max_bytes=self.max_bytes, what="new trust")
        check_threshold(
            envelope,
            keys=self.root.keys,
            authorised=old_root.keyids,
            threshold=old_root.threshold,
            role=f"current (v{self.version}) root",
        )
        new = parse_trust(envelope.payload)
        new_root = new.roles["root"]
        check_threshold(
            envelope,
            keys=new.keys,
            authorised=new_root.keyids,
            threshold=new_root.threshold,
            role=f"new (v{new.version}) root",
        )
        if new.version <= self.version:
            code = outcomes.SAME_VERSION if new.version == self.version else outcomes.ROLLBACK
            raise Refused(
                code, f"trust v{new.version} is not newer than the trusted v{self.version}"
            )
        if new.version != self.version + 1:
            raise Refused(
                outcomes.VERSION_GAP,
                f"trust v{new.version} skips v{self.version + 1}; rotate one by one",
            )
        if new.expires <= moment:
            raise Refused(
                outcomes.EXPIRED, f"trust v{new.version} expired at {format_time(new.expires)}"
            )
        return TrustStore(self.path, new, max_bytes=self.max_bytes)

    def _apply(self, envelopes: list[bytes], now: datetime | None) -> TrustStore:
        """Verify every step of a chain in memory, then write the last one in one atomic step.

        All or nothing: a refused entry anywhere leaves the file and this object as they were,
        so a forged or duplicated link can never leave a half-rotated (revoked) key set behind.
        """
        moment = self.effective_now(now)
        store = self
        resets: dict[str, str] = {}
        for envelope in envelopes:
            store = store._successor(envelope, moment)
            resets.update(store.root.floor_resets)  # a later version's reset wins
        self._check_not_stale()
        write_file_atomic(self.path, envelopes[-1])
        return TrustStore(self.path, store.root, max_bytes=self.max_bytes, floor_resets=resets)

    def _check_not_stale(self) -> None:
        """Refuse to write from an outdated object (another rotation already replaced the file),
        so two holders of the same file can never both turn v{N} into two different v{N+1}."""
        on_disk = _self_verified(_read(self.path, self.max_bytes), self.path, self.max_bytes)
        if on_disk.version != self.version:
            raise TrustError(
                outcomes.STALE_STORE,
                f"{self.path} is at v{on_disk.version}, this copy at v{self.version}; reload it",
            )

    def update(self, message: bytes, *, now: datetime | None = None) -> TrustStore:
        """Apply a trust message: one trust envelope, or a chain (JSON list of envelopes).

        A device that was offline across several rotations needs every version in between, so
        the hub may publish the whole chain; entries not newer than the current version are
        skipped and the rest verified one version at a time, in memory; only when every step
        verified is the newest written (one atomic replace). A refused step is raised and
        nothing changes. Nothing newer: ``same_version``.
        """
        if len(message) > self.max_bytes * MAX_CHAIN:
            raise VerificationError(
                outcomes.TOO_LARGE, f"trust message: {len(message)} bytes is over the chain limit"
            )
        claimed = [(_claimed_version(e), e) for e in _split_chain(message)]
        newer = sorted(
            ((v or 0, e) for v, e in claimed if v is None or v > self.version),
            key=lambda pair: pair[0],
        )
        if not newer:
            raise Refused(
                outcomes.SAME_VERSION, f"trust message has nothing newer than v{self.version}"
            )
        if newer[0][0] > self.version + 1:  # a claim, so only ever grounds to refuse
            raise Refused(
                outcomes.VERSION_GAP,
                f"trust message starts at v{newer[0][0]} but this device has v{self.version}; "
                "publish it with 'edgeagent hub publish --trust-file', which sends every "
                "archived rotation",
            )
        return self._apply([envelope for _, envelope in newer], now)

    # --- verified time --------------------------------------------------------------------

    @property
    def clock_path(self) -> Path:
        return self.path.with_name(self.path.stem + ".verified-time.json")

    def last_verified(self) -> datetime | None:
        """The newest ``issued_at`` this device has accepted, or None before the first one."""
        try:
            data = self.clock_path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            document = loads_strict(data, str(self.clock_path))
            return parse_time(document["last_verified"], f"{self.clock_path}: last_verified")
        except (TrustError, TypeError, KeyError) as exc:
            raise TrustError(
                outcomes.CORRUPT_STATE, f"{self.clock_path}: unreadable ({exc}); delete it to reset"
            ) from exc

    def effective_now(self, now: datetime | None = None) -> datetime:
        """``now`` (default: the system clock), but never earlier than the verified time."""
        moment = now if now is not None else datetime.now(timezone.utc)
        if moment.tzinfo is None:
            raise ValueError("now must be timezone-aware")
        floor = self.last_verified()
        return max(moment, floor) if floor is not None else moment

    def record_verified(self, issued_at: datetime) -> None:
        """Move the verified time forward to ``issued_at`` (never backwards)."""
        floor = self.last_verified()
        if floor is not None and issued_at <= floor:
            return
        document = {"last_verified": format_time(issued_at)}
        write_file_atomic(self.clock_path, json.dumps(document).encode("utf-8") + b"\n")


def _read(path: Path, max_bytes: int) -> bytes:
    """Read at most one byte over the cap, so a huge file is refused without loading it."""
    try:
        with path.open("rb") as handle:
            return handle.read(max_bytes + 1)
    except OSError as exc:
        raise TrustError(
            outcomes.NO_TRUST, f"{path}: cannot read trust file ({exc.strerror})"
        ) from exc


def _split_chain(message: bytes) -> list[bytes]:
    """One envelope stays as it is (its bytes); a JSON list yields each element re-encoded."""
    if not message.lstrip().startswith(b"["):
        return [message]
    items = loads_strict(message, "trust chain")
    if not items or len(items) > MAX_CHAIN or not all(isinstance(i, dict) for i in items):
        raise VerificationError(
            outcomes.MALFORMED, f"trust chain: must be a list of 1-{MAX_CHAIN} trust envelopes"
        )
    return [json.dumps(item).encode("utf-8") for item in items]


def _claimed_version(envelope: bytes) -> int | None:
    """The version a trust envelope *claims*, read unverified and used only to skip old
    entries of a chain; every entry that is applied is fully verified by ``rotate``."""
    try:
        document = loads_strict(decode_envelope(envelope, max_bytes=1 << 20).payload, "trust")
    except TrustError:
        return None
    version = document.get("version") if isinstance(document, dict) else None
    return version if isinstance(version, int) and not isinstance(version, bool) else None


def trust_state_path(state_dir: Path) -> Path:
    """Where the device keeps its live (rotatable) trust file inside the state directory."""
    return Path(state_dir) / "trust" / "trust.json"


def open_trust_store(state_dir: Path, *, seed: Path | None, max_bytes: int) -> TrustStore:
    """The agent's trust store: ``<state_dir>/trust/trust.json`` seeded from ``seed``.

    Typical call: ``open_trust_store(cfg.agent.state_dir, seed=cfg.updates.trust_file,
    max_bytes=cfg.updates.max_manifest_bytes)``.
    """
    return TrustStore.load(trust_state_path(state_dir), seed=seed, max_bytes=max_bytes)
