"""Release manifests (format 2): what one signed release promises, and whether a device may take it.

Format 2 (SPEC §13) names one model and carries a per-model ``serial`` that the hub increments
for every release it signs. The serial — not the model version — is the anti-rollback floor: a
signed release may carry an *older* model version (a fleet rollback), while a replay of any
earlier release (lower serial) is still refused. A payload without ``"format": 2`` (the first
release format) is refused with ``unsupported_format``: see the README's update section.

A manifest pins each artifact — the shared files (``artifact``: model.toml, labels, golden
inputs) and one per variant (``variants``: runtime, precision) — by URL, exact size and
SHA-256 (so a download can be capped at the signed length and checked before unpacking), and
says which devices it is for, when it was issued, when it expires and which agent it needs; an
optional ``canary`` table asks the device to judge the new version on live traffic beside the
old one before committing it (``fleet.canary``). It is parsed only after ``TrustStore.verify``
has checked its signatures, and then refused for policy reasons — expiry, target, version floor
— *before* anything is downloaded: the MQTT message is only a hint.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol
from urllib.parse import urlsplit

from edgeagent import __version__
from edgeagent.fleet import outcomes
from edgeagent.fleet.canary import ReleaseCanary
from edgeagent.fleet.encryption import Encryption, parse_encryption
from edgeagent.fleet.release_ref import ReleaseRef
from edgeagent.fleet.signing import (
    Refused,
    VerificationError,
    format_time,
    loads_strict,
    parse_time,
)
from edgeagent.fleet.trust import TrustStore
from edgeagent.models.names import NAME_RE, VERSION_RE, version_tuple

__all__ = [
    "Artifact",
    "DeviceIdentity",
    "ManifestError",
    "Refused",
    "ReleaseHistory",
    "ReleaseManifest",
    "ReleaseRefused",
    "Targets",
    "VariantArtifact",
    "check_release",
    "parse_manifest",
    "verify_release",
]

DEFAULT_CLOCK_SKEW_S = 300.0
_SHA256_RE = re.compile(r"\A[0-9a-f]{64}\Z", re.ASCII)
_DEPLOYMENT_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}\Z", re.ASCII)
_TARGET_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}\Z", re.ASCII)
MAX_VARIANTS = 64
_VARIANT_FIELD_RE = re.compile(r"\A[a-z0-9][a-z0-9_]{0,31}\Z", re.ASCII)  # runtime, precision
MAX_TARGETS = 1024  # entries per targets list (a stage of a rollout names its devices)
MAX_URL_CHARS = 2048
FORMAT = 2
MAX_SERIAL = 2**53 - 1  # exact in every JSON parser
_FIELDS = {
    "type",
    "format",
    "serial",
    "model",
    "version",
    "artifact",
    "variants",
    "targets",
    "issued_at",
    "expires",
    "deployment_id",
    "min_agent_version",
}
_OPTIONAL_FIELDS = {"canary"}  # written only when set, so a release without one signs as before
_TARGET_FIELDS = ("profiles", "device_classes", "device_ids")


class ManifestError(VerificationError):
    """A correctly signed payload that is not a valid release manifest (code ``malformed``, or
    ``unsupported_format`` for a release of another format)."""

    def __init__(self, message: str, code: str = outcomes.MALFORMED) -> None:
        super().__init__(code, message)


@dataclass(frozen=True)
class Artifact:
    url: str
    size: int
    sha256: str


@dataclass(frozen=True)
class VariantArtifact:
    """One variant's files (a ``.tar.gz``): a device downloads only the variants it runs."""

    runtime: str
    precision: str
    artifact: Artifact
    encryption: Encryption | None = None  # a sealed variant: its wrapped content keys

    @property
    def key(self) -> str:
        """The package's spelling of a variant (``ModelPackage.variant`` / ``Variant.key``)."""
        return f"{self.runtime}/{self.precision}"

    def to_dict(self) -> dict[str, Any]:
        sealed = {"encryption": self.encryption.to_dict()} if self.encryption else {}
        return {
            "runtime": self.runtime,
            "precision": self.precision,
            **_artifact_dict(self.artifact),
            **sealed,
        }


def _artifact_dict(artifact: Artifact) -> dict[str, Any]:
    return {"url": artifact.url, "size": artifact.size, "sha256": artifact.sha256}


@dataclass(frozen=True)
class Targets:
    """Who may install the release; an empty list means "any" for that criterion."""

    profiles: tuple[str, ...] = ()
    device_classes: tuple[str, ...] = ()
    device_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class DeviceIdentity:
    device_id: str
    profile: str
    device_class: str
    agent_version: str = __version__


@dataclass(frozen=True)
class ReleaseManifest:
    model: str
    version: str
    serial: int
    artifact: Artifact  # the shared files
    variants: tuple[VariantArtifact, ...]
    issued_at: datetime
    expires: datetime
    deployment_id: str
    targets: Targets = field(default_factory=Targets)
    min_agent_version: str = "0.0.0"
    canary: ReleaseCanary | None = None  # on-device canary before the commit (fleet.canary)

    def to_dict(self) -> dict[str, Any]:
        optional = {} if self.canary is None else {"canary": self.canary.to_dict()}
        return {
            **optional,
            "type": "release",
            "format": FORMAT,
            "serial": self.serial,
            "model": self.model,
            "version": self.version,
            "artifact": _artifact_dict(self.artifact),
            "variants": [variant.to_dict() for variant in self.variants],
            "targets": {name: list(getattr(self.targets, name)) for name in _TARGET_FIELDS},
            "issued_at": format_time(self.issued_at),
            "expires": format_time(self.expires),
            "deployment_id": self.deployment_id,
            "min_agent_version": self.min_agent_version,
        }

    def ref(self) -> ReleaseRef:
        """The release as outcomes name it."""
        return ReleaseRef(self.model, self.version, self.deployment_id)

    def to_payload(self) -> bytes:
        """The canonical bytes the hub signs (sorted keys, no spaces)."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":")).encode("utf-8")


def _string(document: dict[str, Any], key: str, pattern: re.Pattern[str], rule: str) -> str:
    value = document[key]
    if not isinstance(value, str) or not pattern.match(value):
        raise ManifestError(f"manifest {key}: {str(value)[:80]!r} is not {rule}")
    return value


def _artifact(value: Any, where: str = "artifact", extra: frozenset[str] = frozenset()) -> Artifact:
    if not isinstance(value, dict) or set(value) != {"url", "size", "sha256"} | extra:
        fields = ", ".join(sorted({"url", "size", "sha256"} | extra))
        raise ManifestError(f"manifest {where}: must be an object with {fields}")
    url = value["url"]
    parts = urlsplit(url) if isinstance(url, str) and len(url) <= MAX_URL_CHARS else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
        raise ManifestError(
            f"manifest {where}.url: {str(url)[:80]!r} is not an http(s) URL "
            f"of at most {MAX_URL_CHARS} characters"
        )
    size = value["size"]
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ManifestError(f"manifest {where}.size: {str(size)[:40]!r} is not a positive integer")
    sha256 = _string(value, "sha256", _SHA256_RE, "64 lowercase hex digits")
    return Artifact(url=url, size=size, sha256=sha256)


def _variants(value: Any) -> tuple[VariantArtifact, ...]:
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_VARIANTS:
        raise ManifestError(f"manifest variants: must be a list of 1-{MAX_VARIANTS} variants")
    variants = []
    for index, item in enumerate(value):
        where = f"variants[{index}]"
        sealed = isinstance(item, dict) and "encryption" in item
        extra = {"runtime", "precision"} | ({"encryption"} if sealed else set())
        artifact = _artifact(item, where, frozenset(extra))
        runtime, precision = (
            _string(item, key, _VARIANT_FIELD_RE, "1-32 lowercase letters, digits or '_'")
            for key in ("runtime", "precision")
        )
        try:
            encryption = parse_encryption(item["encryption"], where) if sealed else None
        except ValueError as exc:
            raise ManifestError(f"manifest {exc}") from exc
        variants.append(VariantArtifact(runtime, precision, artifact, encryption))
    keys = [variant.key for variant in variants]
    if len(set(keys)) != len(keys):
        raise ManifestError("manifest variants: a runtime/precision is listed twice")
    return tuple(variants)


def _targets(value: Any) -> Targets:
    if not isinstance(value, dict):
        raise ManifestError("manifest targets: must be an object")
    unknown = sorted(set(value) - set(_TARGET_FIELDS))
    if unknown:
        raise ManifestError(
            f"manifest targets: unknown criterion {', '.join(unknown)} (cannot be checked here)"
        )
    lists = {}
    for name in _TARGET_FIELDS:
        items = value.get(name, [])
        if (
            not isinstance(items, list)
            or len(items) > MAX_TARGETS
            or not all(isinstance(i, str) and _TARGET_RE.match(i) for i in items)
        ):
            raise ManifestError(
                f"manifest targets.{name}: must be a list of at most {MAX_TARGETS} names "
                "(1-128 letters, digits, '_', '.', ':', '-')"
            )
        lists[name] = tuple(items)
    return Targets(**lists)


def _validity_and_serial(document: dict[str, Any], what: str) -> tuple[datetime, datetime, int]:
    """A signed document's ``issued_at``, ``expires`` (later) and ``serial`` (1..2^53-1): the
    fields model and agent release manifests share, read by the same rules."""
    try:
        issued_at = parse_time(document["issued_at"], f"{what} issued_at")
        expires = parse_time(document["expires"], f"{what} expires")
    except VerificationError as exc:
        raise ManifestError(exc.message) from exc
    if expires <= issued_at:
        raise ManifestError(f"{what} expires: must be later than issued_at")
    serial = document["serial"]
    if isinstance(serial, bool) or not isinstance(serial, int) or not 1 <= serial <= MAX_SERIAL:
        raise ManifestError(f"{what} serial: {str(serial)[:40]!r} is not an integer 1..2^53-1")
    return issued_at, expires, serial


def parse_manifest(payload: bytes) -> ReleaseManifest:
    """Validate every field of a release payload; call only on signature-checked bytes."""
    try:
        document = loads_strict(payload, "manifest")
    except VerificationError as exc:
        raise ManifestError(exc.message) from exc
    if not isinstance(document, dict):
        raise ManifestError("manifest: must be a JSON object")
    form = document.get("format")
    if document.get("type") == "release" and (type(form) is not int or form != FORMAT):
        raise ManifestError(
            f"manifest format: {str(form)[:20]!r} is not {FORMAT}; this agent "
            "takes only release format 2 (sign it with a hub of this version)",
            "unsupported_format",
        )
    missing = sorted(_FIELDS - set(document))
    extra = sorted(set(document) - _FIELDS - _OPTIONAL_FIELDS)
    if missing or extra:
        raise ManifestError(
            f"manifest: missing field(s) {', '.join(missing) or '-'}; "
            f"unknown field(s) {', '.join(extra) or '-'}"
        )
    if document["type"] != "release":
        raise ManifestError(f"manifest type: must be 'release', got {document['type']!r}")
    issued_at, expires, serial = _validity_and_serial(document, "manifest")
    return ReleaseManifest(
        serial=serial,
        model=_string(document, "model", NAME_RE, "1-64 letters, digits, '_', '-' or '.'"),
        version=_string(document, "version", VERSION_RE, "an integer or MAJOR.MINOR.PATCH"),
        artifact=_artifact(document["artifact"]),
        variants=_variants(document["variants"]),
        targets=_targets(document["targets"]),
        issued_at=issued_at,
        expires=expires,
        deployment_id=_string(
            document, "deployment_id", _DEPLOYMENT_RE, "1-128 letters, digits, '_', '.', ':', '-'"
        ),
        min_agent_version=_string(
            document, "min_agent_version", VERSION_RE, "an integer or MAJOR.MINOR.PATCH"
        ),
        canary=_canary(document["canary"]) if "canary" in document else None,
    )


def _canary(value: Any) -> ReleaseCanary:
    try:
        return ReleaseCanary.parse(value)
    except ValueError as exc:
        raise ManifestError(f"manifest canary: {exc}") from exc


def _target_mismatch(targets: Targets, device: DeviceIdentity) -> str | None:
    for name, mine in (
        ("profiles", device.profile),
        ("device_classes", device.device_class),
        ("device_ids", device.device_id),
    ):
        allowed = getattr(targets, name)
        if allowed and mine not in allowed:
            return f"targets.{name} is {list(allowed)}; this device has {mine!r}"
    return None


def check_release(
    manifest: ReleaseManifest,
    *,
    now: datetime,
    device: DeviceIdentity,
    floor: str | None,
    bad_versions: Collection[str],
    serial_floor: int | None = None,
    max_artifact_bytes: int,
    clock_skew_s: float = DEFAULT_CLOCK_SKEW_S,
) -> None:
    """Raise ``Refused`` unless this device may install ``manifest`` at ``now``.

    ``now`` is fixed by the caller once per check (and already raised to the verified time);
    ``serial_floor`` is the serial of the release committed last: a release must carry a
    higher one (any model version other than the committed one, so a signed rollback installs;
    a replay never does). ``floor`` is the committed version, and a version floor while no
    serial is recorded — the factory seed's version, or a root-signed floor reset;
    ``bad_versions`` are those that failed a health gate. ``clock_skew_s`` tolerates a device
    clock slightly behind the hub's.
    """
    name = f"{manifest.model} {manifest.version}"
    if manifest.expires <= now:
        raise Refused(outcomes.EXPIRED, f"{name}: expired at {format_time(manifest.expires)}")
    if manifest.issued_at > now + timedelta(seconds=clock_skew_s):
        raise Refused(
            outcomes.NOT_YET_VALID,
            f"{name}: issued at {format_time(manifest.issued_at)}, after this device's time "
            f"{format_time(now)} (check the device clock)",
        )
    mismatch = _target_mismatch(manifest.targets, device)
    if mismatch:
        raise Refused(outcomes.WRONG_TARGET, f"{name}: {mismatch}")
    if version_tuple(device.agent_version) < version_tuple(manifest.min_agent_version):
        raise Refused(
            outcomes.AGENT_TOO_OLD,
            f"{name}: needs agent {manifest.min_agent_version}, this is {device.agent_version}",
        )
    version = version_tuple(manifest.version)
    if any(version_tuple(bad) == version for bad in bad_versions):
        raise Refused(outcomes.KNOWN_BAD, f"{name}: failed its health check here before")
    if serial_floor is not None:
        if manifest.serial < serial_floor:
            raise Refused(
                outcomes.REPLAY,
                f"{name}: serial {manifest.serial} is below serial {serial_floor} committed here",
            )
        if manifest.serial == serial_floor:
            raise Refused(
                outcomes.SAME_VERSION, f"{name}: serial {serial_floor} is already installed"
            )
        if floor is not None and version == version_tuple(floor):
            raise Refused(outcomes.SAME_VERSION, f"{name}: version {floor} is already serving")
    elif floor is not None:
        if version < version_tuple(floor):
            raise Refused(outcomes.ROLLBACK, f"{name}: older than the installed version {floor}")
        if version == version_tuple(floor):
            raise Refused(outcomes.SAME_VERSION, f"{name}: version {floor} is already installed")
    largest = max([manifest.artifact, *(v.artifact for v in manifest.variants)], key=_size)
    if largest.size > max_artifact_bytes:
        raise Refused(
            outcomes.TOO_LARGE,
            f"{name}: artifact {largest.url.rsplit('/', 1)[-1][:80]} is {largest.size} bytes, "
            f"over the limit of {max_artifact_bytes} ([updates] max_artifact_bytes)",
        )


def _size(artifact: Artifact) -> int:
    return artifact.size


class ReleaseRefused(Refused):
    """A ``Refused`` for an authentic manifest: carries it, so the refusal can be reported with
    its model, version and deployment id without verifying the envelope again."""

    def __init__(self, refused: Refused, manifest: ReleaseManifest) -> None:
        super().__init__(refused.code, refused.message)
        self.manifest = manifest


class ReleaseHistory(Protocol):
    """What the store remembers per model (``ModelStore`` provides it)."""

    def floor(self, model: str) -> str | None: ...

    def serial_floor(self, model: str) -> int | None: ...

    def bad_versions(self, model: str) -> set[str]: ...


def verify_release(
    envelope: bytes,
    trust: TrustStore,
    *,
    device: DeviceIdentity,
    history: ReleaseHistory,
    max_artifact_bytes: int,
    clock_skew_s: float = DEFAULT_CLOCK_SKEW_S,
    now: datetime | None = None,
) -> ReleaseManifest:
    """The whole pre-download check: signatures, then parse, then policy; then trust the time.

    Raises ``VerificationError`` / ``ManifestError`` / ``ReleaseRefused`` (all ``TrustError``,
    with a ``code``) and changes nothing on disk when it does. On success the verified time
    moves up to the manifest's ``issued_at``.
    """
    moment = trust.effective_now(now)
    payload = trust.verify(envelope, "release")
    manifest = parse_manifest(payload)
    try:
        if trust.expires <= moment:
            raise Refused(
                outcomes.EXPIRED,
                f"trust file v{trust.version} expired at {format_time(trust.expires)}; "
                "the hub must rotate it",
            )
        check_release(
            manifest,
            now=moment,
            device=device,
            floor=history.floor(manifest.model),
            serial_floor=history.serial_floor(manifest.model),
            bad_versions=history.bad_versions(manifest.model),
            max_artifact_bytes=max_artifact_bytes,
            clock_skew_s=clock_skew_s,
        )
    except Refused as exc:
        raise ReleaseRefused(exc, manifest) from exc
    trust.record_verified(manifest.issued_at)
    return manifest
