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
old one before committing it (``fleet.release_canary``). It is parsed only after
``TrustStore.verify`` has checked its signatures, and then refused for policy reasons —
expiry, target, version floor — *before* anything is downloaded: the MQTT message is only a hint.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from edgeagent import __version__
from edgeagent.fleet import outcomes
from edgeagent.fleet.artifact import Artifact, Delta, artifact_dict, read_artifact
from edgeagent.fleet.encryption import Encryption, parse_encryption
from edgeagent.fleet.release_canary import ReleaseCanary
from edgeagent.fleet.release_ref import ReleaseRef
from edgeagent.fleet.signing import (
    Refused,
    VerificationError,
    format_time,
    loads_strict,
    parse_time,
)
from edgeagent.fleet.trust import TrustStore
from edgeagent.fleet.windows import MaintenanceWindow, WindowError
from edgeagent.fleet.wire import Reader, integer_in, is_object
from edgeagent.models.names import NAME_RE, VERSION_RE, version_tuple

__all__ = [
    "Artifact",
    "Delta",
    "DeviceIdentity",
    "ManifestError",
    "Refused",
    "ReleaseHistory",
    "ReleaseManifest",
    "ReleaseRefused",
    "Targets",
    "VariantArtifact",
    "check_release",
    "judge_release",
    "parse_manifest",
    "verify_release",
]

DEFAULT_CLOCK_SKEW_S = 300.0
_DEPLOYMENT_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}\Z", re.ASCII)
_TARGET_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}\Z", re.ASCII)
MAX_VARIANTS = 64
_VARIANT_FIELD_RE = re.compile(r"\A[a-z0-9][a-z0-9_]{0,31}\Z", re.ASCII)  # runtime, precision
MAX_TARGETS = 1024  # entries per targets list (a stage of a rollout names its devices)
FORMAT = 2
MAX_SERIAL = 2**53 - 1  # exact in every JSON parser
# the fields every release shares (``read_opening``), then a model release's own
OPENING_FIELDS = frozenset(
    {"type", "format", "serial", "targets", "issued_at", "expires", "deployment_id"}
)
_FIELDS = OPENING_FIELDS | {"model", "version", "artifact", "variants", "min_agent_version"}
# written only when set, so a release without them signs as before
_OPTIONAL_FIELDS = {"canary", "window"}
_TARGET_FIELDS = ("profiles", "device_classes", "device_ids")


class ManifestError(VerificationError):
    """A correctly signed payload that is not a valid release manifest (code ``malformed``, or
    ``unsupported_format`` for a release of another format)."""

    def __init__(self, message: str, code: str = outcomes.MALFORMED) -> None:
        super().__init__(code, message)


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
            **artifact_dict(self.artifact),
            **sealed,
        }


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
    canary: ReleaseCanary | None = None  # on-device canary before the commit (fleet.release_canary)
    window: MaintenanceWindow | None = None  # when the device may take it (fleet.windows)

    def to_dict(self) -> dict[str, Any]:
        optional = {} if self.canary is None else {"canary": self.canary.to_dict()}
        if self.window is not None:
            optional["window"] = self.window.to_dict()
        return {
            **optional,
            "type": "release",
            "format": FORMAT,
            "serial": self.serial,
            "model": self.model,
            "version": self.version,
            "artifact": artifact_dict(self.artifact),
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


def _reader(what: str = "manifest") -> Reader:
    return Reader(what, ManifestError)


_MANIFEST = _reader()


def _artifact(
    value: Any,
    where: str = "artifact",
    extra: frozenset[str] = frozenset(),
    reader: Reader = _MANIFEST,
) -> Artifact:
    """A pinned download (``fleet.artifact``), beside the ``extra`` keys of the object it is
    part of (a variant's runtime, a wheelhouse's platform)."""
    return read_artifact(reader, value, where, extra)


def _variants(value: Any) -> tuple[VariantArtifact, ...]:
    reader = _MANIFEST
    problem = f"must be a list of 1-{MAX_VARIANTS} variants"
    variants = []
    for index, item in enumerate(reader.items(value, "variants", 1, MAX_VARIANTS, problem)):
        where = f"variants[{index}]"
        sealed = is_object(item) and "encryption" in item
        extra = {"runtime", "precision"} | ({"encryption"} if sealed else set())
        artifact = _artifact(item, where, frozenset(extra))
        runtime, precision = (
            reader.text(item[key], key, _VARIANT_FIELD_RE, "1-32 lowercase letters, digits or '_'")
            for key in ("runtime", "precision")
        )
        try:
            encryption = parse_encryption(item["encryption"], where) if sealed else None
        except ValueError as exc:
            raise ManifestError(f"manifest {exc}") from exc
        variants.append(VariantArtifact(runtime, precision, artifact, encryption))
    reader.distinct([v.key for v in variants], "variants", "a runtime/precision is listed twice")
    return tuple(variants)


def _targets(value: Any, reader: Reader = _MANIFEST) -> Targets:
    criteria = reader.object(value, "targets")
    unknown = sorted(set(criteria) - set(_TARGET_FIELDS))
    if unknown:
        raise reader.fail(
            "targets", f"unknown criterion {', '.join(unknown)} (cannot be checked here)"
        )
    problem = (
        f"must be a list of at most {MAX_TARGETS} names (1-128 letters, digits, '_', '.', ':', '-')"
    )
    lists = {
        name: reader.texts(
            criteria.get(name, []), f"targets.{name}", MAX_TARGETS, _TARGET_RE, problem
        )
        for name in _TARGET_FIELDS
    }
    return Targets(**lists)


@dataclass(frozen=True)
class Opening:
    """The fields every signed release shares, model or agent, read by the same rules: who it
    is for, when it is valid, its place in the anti-rollback order and its rollout."""

    serial: int
    issued_at: datetime
    expires: datetime
    deployment_id: str
    targets: Targets


def read_document(payload: bytes, what: str) -> tuple[Reader, dict[str, Any]]:
    """A signed payload as a JSON object, and the reader that names ``what`` in its refusals."""
    try:
        document = loads_strict(payload, what)
    except VerificationError as exc:
        raise ManifestError(exc.message) from exc
    reader = _reader(what)
    return reader, reader.object(document, "", "must be a JSON object")


def read_validity(reader: Reader, document: dict[str, Any]) -> tuple[datetime, datetime, int]:
    """``issued_at``, ``expires`` (later) and ``serial`` (1..2^53-1) of any signed document
    (release, agent release, cancellation) whose field set ``reader.fields`` has checked."""
    what = reader.what
    try:
        issued_at = parse_time(document["issued_at"], f"{what} issued_at")
        expires = parse_time(document["expires"], f"{what} expires")
    except VerificationError as exc:
        raise ManifestError(exc.message) from exc
    if expires <= issued_at:
        raise reader.fail("expires", "must be later than issued_at")
    serial = reader.integer(document["serial"], "serial", 1, MAX_SERIAL, "an integer 1..2^53-1")
    return issued_at, expires, serial


def read_deployment_id(reader: Reader, document: dict[str, Any]) -> str:
    """The rollout a signed document belongs to (a release's, or the one a cancellation stops)."""
    rule = "1-128 letters, digits, '_', '.', ':', '-'"
    return reader.text(document["deployment_id"], "deployment_id", _DEPLOYMENT_RE, rule)


def read_opening(reader: Reader, document: dict[str, Any]) -> Opening:
    """The shared fields of a release document whose field set ``reader.fields`` has checked:
    validity and serial (``read_validity``), ``deployment_id``, ``targets``."""
    issued_at, expires, serial = read_validity(reader, document)
    return Opening(
        serial=serial,
        issued_at=issued_at,
        expires=expires,
        deployment_id=read_deployment_id(reader, document),
        targets=_targets(document["targets"], reader),
    )


def parse_manifest(payload: bytes) -> ReleaseManifest:
    """Validate every field of a release payload; call only on signature-checked bytes."""
    reader, document = read_document(payload, "manifest")
    form = document.get("format")
    if document.get("type") == "release" and integer_in(form, FORMAT, FORMAT) is None:
        raise ManifestError(
            f"manifest format: {str(form)[:20]!r} is not {FORMAT}; this agent "
            "takes only release format 2 (sign it with a hub of this version)",
            "unsupported_format",
        )
    reader.fields(document, _FIELDS, _OPTIONAL_FIELDS)
    if document["type"] != "release":
        raise reader.fail("type", f"must be 'release', got {document['type']!r}")
    opening = read_opening(reader, document)
    version_rule = "an integer or MAJOR.MINOR.PATCH"
    return ReleaseManifest(
        serial=opening.serial,
        model=reader.text(
            document["model"], "model", NAME_RE, "1-64 letters, digits, '_', '-' or '.'"
        ),
        version=reader.text(document["version"], "version", VERSION_RE, version_rule),
        artifact=_artifact(document["artifact"]),
        variants=_variants(document["variants"]),
        targets=opening.targets,
        issued_at=opening.issued_at,
        expires=opening.expires,
        deployment_id=opening.deployment_id,
        min_agent_version=reader.text(
            document["min_agent_version"], "min_agent_version", VERSION_RE, version_rule
        ),
        canary=_canary(document["canary"]) if "canary" in document else None,
        window=_window(document["window"]) if "window" in document else None,
    )


def _window(value: Any) -> MaintenanceWindow:
    try:
        return MaintenanceWindow.parse(value)
    except WindowError as exc:
        raise ManifestError(f"manifest window: {exc}") from exc


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


def verify_release(envelope: bytes, trust: TrustStore, **checks: Any) -> ReleaseManifest:
    """The whole pre-download check: signatures, then parse, then policy; then trust the time.

    ``checks`` are ``judge_release``'s (the device, its history, its limits). Raises
    ``VerificationError`` / ``ManifestError`` / ``ReleaseRefused`` (all ``TrustError``, with a
    ``code``) and changes nothing on disk when it does. On success the verified time moves up
    to the manifest's ``issued_at``.
    """
    manifest, refusal = judge_release(trust.verify(envelope, "release"), trust, **checks)
    if refusal is not None:
        raise ReleaseRefused(refusal, manifest)
    return manifest


def judge_release(
    payload: bytes,
    trust: TrustStore,
    *,
    device: DeviceIdentity,
    history: ReleaseHistory,
    max_artifact_bytes: int,
    clock_skew_s: float = DEFAULT_CLOCK_SKEW_S,
    now: datetime | None = None,
) -> tuple[ReleaseManifest, Refused | None]:
    """``verify_release`` after the signatures (``payload`` is what ``trust.verify`` returned):
    parse, then policy. The authentic manifest comes back with the policy's refusal, or None
    once the release may be taken, and only then does the verified time move up to its
    ``issued_at``. A payload that is no valid manifest raises ``ManifestError``."""
    moment = trust.effective_now(now)
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
        return manifest, exc
    trust.record_verified(manifest.issued_at)
    return manifest, None
