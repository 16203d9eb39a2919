"""Ed25519 envelopes: the one signed container for trust files and release manifests.

An envelope is JSON ``{"payload": base64(raw bytes), "signatures": [{"keyid", "sig"}]}``.
Signatures cover the *raw payload bytes*, so the device checks them before it parses a single
field of the payload (TUF's rule: never feed unauthenticated bytes to a parser you must trust).
A key id is the hex SHA-256 of the raw 32-byte public key, so it can be recomputed from the key
and cannot be chosen by an attacker.

Every refusal is a ``TrustError`` with a stable ``code`` (reported to the hub as-is) and a
message that says what was wrong and where.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
import sys
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from edgeagent.fleet import outcomes

_KEYID_RE = re.compile(r"\A[0-9a-f]{64}\Z", re.ASCII)
_SIGNATURE_BYTES = 64
_PUBLIC_KEY_BYTES = 32


class TrustError(Exception):
    """Base of every refused update or trust change: ``code`` is machine-readable, stable.

    Raised as the base class itself for the trust store's own state: ``no_trust`` (nothing
    provisioned), ``corrupt_state`` (verified-time file unreadable), ``stale_store`` (an
    outdated TrustStore object tried to rotate).
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class VerificationError(TrustError):
    """The envelope is not signed by enough trusted keys, or cannot be read at all.

    Codes: ``bad_signature``, ``unknown_key``, ``below_threshold``, ``malformed``, ``too_large``.
    """


class Refused(TrustError):
    """Authentic, but not acceptable now or here: a policy refusal rather than a forgery.

    Codes: ``expired``, ``not_yet_valid``, ``rollback``, ``same_version``, ``version_gap``,
    ``wrong_target``, ``too_large``, ``agent_too_old``, ``known_bad``.
    """


@dataclass(frozen=True)
class Signature:
    keyid: str
    sig: bytes


@dataclass(frozen=True)
class Envelope:
    payload: bytes
    signatures: tuple[Signature, ...]


def raw_public_bytes(public_key: Ed25519PublicKey) -> bytes:
    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def keyid_of(public_key: Ed25519PublicKey) -> str:
    """The key id: hex SHA-256 of the raw public key (recomputable, so it cannot lie)."""
    return hashlib.sha256(raw_public_bytes(public_key)).hexdigest()


def public_key_from_hex(value: Any, where: str) -> Ed25519PublicKey:
    """Decode a hex Ed25519 public key from a trust file; ``where`` names the field on error."""
    try:
        raw = bytes.fromhex(value) if isinstance(value, str) else b""
    except ValueError:
        raw = b""
    if len(raw) != _PUBLIC_KEY_BYTES:
        raise VerificationError(
            outcomes.MALFORMED, f"{where}: must be {2 * _PUBLIC_KEY_BYTES} hex digits (Ed25519 key)"
        )
    return Ed25519PublicKey.from_public_bytes(raw)


def sign_envelope(payload: bytes, keys: Iterable[Ed25519PrivateKey]) -> bytes:
    """Sign ``payload`` with each key (once per key id) and return the envelope's JSON bytes."""
    signatures: dict[str, bytes] = {}
    for key in keys:
        signatures.setdefault(keyid_of(key.public_key()), key.sign(payload))
    if not signatures:
        raise ValueError("an envelope needs at least one signing key")
    return encode_envelope(Envelope(payload, tuple(Signature(k, s) for k, s in signatures.items())))


def encode_envelope(envelope: Envelope) -> bytes:
    document = {
        "payload": base64.b64encode(envelope.payload).decode("ascii"),
        "signatures": [
            {"keyid": s.keyid, "sig": base64.b64encode(s.sig).decode("ascii")}
            for s in envelope.signatures
        ],
    }
    return json.dumps(document, indent=1, sort_keys=True).encode("utf-8") + b"\n"


MAX_JSON_DEPTH = 32  # nesting of objects/lists in any fleet document; real ones use 4


def json_depth(text: str) -> int:
    """The deepest nesting of ``[``/``{`` in JSON text, brackets inside strings ignored.

    Checked before parsing so hostile nesting is refused in linear time, without recursion.
    """
    depth = deepest = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def loads_strict(data: bytes, what: str, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Parse JSON refusing duplicate keys, NaN/Infinity (which parsers disagree on) and
    nesting deeper than ``max_depth``."""

    def no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        result: dict[str, Any] = {}
        for key, value in pairs:
            if key in result:
                raise VerificationError(outcomes.MALFORMED, f"{what}: key {key!r} appears twice")
            result[key] = value
        return result

    def no_constants(name: str) -> Any:
        raise VerificationError(outcomes.MALFORMED, f"{what}: {name} is not valid JSON")

    def integer(digits: str) -> int:
        # Python refuses to convert more than sys.get_int_max_str_digits() digits (4,300) with
        # a plain ValueError, which no caller expects from a parse: say what it is instead.
        try:
            return int(digits)
        except ValueError as exc:
            limit = sys.get_int_max_str_digits()
            raise VerificationError(
                outcomes.MALFORMED,
                f"{what}: an integer of {len(digits)} characters is too long (at most {limit} "
                "digits)",
            ) from exc

    try:
        text = data.decode("utf-8")
        if json_depth(text) > max_depth:
            raise VerificationError(
                outcomes.MALFORMED, f"{what}: nested deeper than {max_depth} levels"
            )
        return json.loads(
            text, object_pairs_hook=no_duplicates, parse_constant=no_constants, parse_int=integer
        )
    except UnicodeDecodeError as exc:
        raise VerificationError(outcomes.MALFORMED, f"{what}: not UTF-8 ({exc.reason})") from exc
    except json.JSONDecodeError as exc:
        raise VerificationError(outcomes.MALFORMED, f"{what}: not valid JSON ({exc})") from exc
    except RecursionError as exc:
        raise VerificationError(outcomes.MALFORMED, f"{what}: nested too deeply") from exc


def _b64(value: Any, where: str) -> bytes:
    if not isinstance(value, str):
        raise VerificationError(outcomes.MALFORMED, f"{where}: must be a base64 string")
    try:
        return base64.b64decode(value.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError) as exc:
        raise VerificationError(outcomes.MALFORMED, f"{where}: not valid base64 ({exc})") from exc


def decode_envelope(data: bytes, *, max_bytes: int, what: str = "envelope") -> Envelope:
    """Check the size, then the envelope's shape; the payload stays opaque bytes."""
    if len(data) > max_bytes:
        raise VerificationError(
            outcomes.TOO_LARGE, f"{what}: {len(data)} bytes is over the limit of {max_bytes} bytes"
        )
    document = loads_strict(data, what)
    if not isinstance(document, dict) or set(document) != {"payload", "signatures"}:
        raise VerificationError(
            outcomes.MALFORMED, f"{what}: must be an object with exactly 'payload' and 'signatures'"
        )
    payload = _b64(document["payload"], f"{what}: payload")
    entries = document["signatures"]
    if not isinstance(entries, list) or not entries:
        raise VerificationError(outcomes.MALFORMED, f"{what}: signatures must be a non-empty list")
    signatures = []
    for index, entry in enumerate(entries):
        where = f"{what}: signatures[{index}]"
        if not isinstance(entry, dict) or set(entry) != {"keyid", "sig"}:
            raise VerificationError(
                outcomes.MALFORMED, f"{where}: must be an object with keyid and sig"
            )
        keyid = entry["keyid"]
        if not isinstance(keyid, str) or not _KEYID_RE.match(keyid):
            raise VerificationError(
                outcomes.MALFORMED, f"{where}.keyid: must be 64 lowercase hex digits"
            )
        signatures.append(Signature(keyid, _b64(entry["sig"], f"{where}.sig")))
    return Envelope(payload, tuple(signatures))


def check_threshold(
    envelope: Envelope,
    *,
    keys: Mapping[str, Ed25519PublicKey],
    authorised: Collection[str],
    threshold: int,
    role: str,
) -> set[str]:
    """Return the authorised key ids with a valid signature; raise unless there are ``threshold``.

    Each key id counts once however often it signs. Signatures by keys outside the role are
    ignored when the threshold is met (rotation envelopes carry both old and new keys); when it
    is not, the most telling reason is reported: a bad signature by an authorised key; else,
    with no valid signature at all, a signature by a key the role does not know; else simply
    too few signatures.
    """
    valid: set[str] = set()
    bad: set[str] = set()
    unknown: set[str] = set()
    for signature in envelope.signatures:
        keyid = signature.keyid
        if keyid in valid:
            continue
        if keyid not in authorised or keyid not in keys:
            unknown.add(keyid)
            continue
        if len(signature.sig) != _SIGNATURE_BYTES:
            bad.add(keyid)
            continue
        try:
            keys[keyid].verify(signature.sig, envelope.payload)
        except InvalidSignature:
            bad.add(keyid)
            continue
        valid.add(keyid)
    if len(valid) >= threshold:
        return valid
    counted = f"{len(valid)} valid {role} signature(s), {threshold} needed"
    if bad - valid:
        ids = ", ".join(sorted(k[:12] for k in bad - valid))
        raise VerificationError(
            outcomes.BAD_SIGNATURE, f"signature by {role} key {ids} is invalid; {counted}"
        )
    if unknown and not valid:
        ids = ", ".join(sorted(k[:12] for k in unknown))
        raise VerificationError(
            outcomes.UNKNOWN_KEY, f"key {ids} is not a trusted {role} key; {counted}"
        )
    raise VerificationError(outcomes.BELOW_THRESHOLD, counted)


def parse_time(value: Any, where: str) -> datetime:
    """An ISO-8601 timestamp with a zone ('Z' or an offset); naive times are ambiguous, refused."""
    if not isinstance(value, str):
        raise VerificationError(outcomes.MALFORMED, f"{where}: must be an ISO-8601 string")
    text = value[:-1] + "+00:00" if value.endswith(("Z", "z")) else value
    try:
        moment = datetime.fromisoformat(text)
    except ValueError as exc:
        raise VerificationError(outcomes.MALFORMED, f"{where}: {value!r} is not ISO-8601") from exc
    if moment.tzinfo is None:
        raise VerificationError(
            outcomes.MALFORMED, f"{where}: {value!r} has no time zone (add 'Z')"
        )
    return moment.astimezone(timezone.utc)


def format_time(moment: datetime) -> str:
    """UTC, second precision, 'Z' suffix: the form every envelope in the fleet uses."""
    return moment.astimezone(timezone.utc).replace(microsecond=0).strftime("%Y-%m-%dT%H:%M:%SZ")
