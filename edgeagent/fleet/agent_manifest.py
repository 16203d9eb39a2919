"""Agent release manifests: a signed promise of a new agent (code), and whether a device takes it.

An agent release is the agent itself — its wheel and every dependency wheel, one *wheelhouse*
tarball per platform (``linux_x86_64``, ``linux_aarch64``) for one Python version — so a
device with no package index can install it (``selfupdate``). It travels the model channel
(same envelope, same retained release slots) but is signed by the trust file's separate
``agent`` role: a model release key can ship weights, never code, and a trust file without that
role takes no agent release at all.

Anti-rollback is the one models use (release format 2): a hub-incremented ``serial`` per agent
release, so a replay of an older (still unexpired) release is refused, while a deliberate,
newly signed downgrade is possible. Before any serial was committed here, the running agent's
version is the floor. Everything is checked *before* a byte is downloaded.
"""

from __future__ import annotations

import json
import platform
import re
import sys
from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol

from edgeagent.fleet import outcomes
from edgeagent.fleet.artifact import artifact_dict
from edgeagent.fleet.manifest import (
    DEFAULT_CLOCK_SKEW_S,
    FORMAT,
    OPENING_FIELDS,
    Artifact,
    DeviceIdentity,
    ManifestError,
    Targets,
    _artifact,
    _target_mismatch,
    read_document,
    read_opening,
)
from edgeagent.fleet.release_ref import ReleaseRef
from edgeagent.fleet.signing import (
    Refused,
    TrustError,
    decode_envelope,
    format_time,
    loads_strict,
)
from edgeagent.fleet.trust import TrustStore
from edgeagent.fleet.wire import Reader, integer_in, is_object, text_field
from edgeagent.models.names import VERSION_RE, version_tuple

KIND = "agent_release"  # the payload's "type"; model releases are "release"
AGENT_SLOT = "_agent"  # the retained release slot of agent releases (no model name starts so)
MAX_PLATFORMS = 16
_PLATFORM_RE = re.compile(r"\A[a-z0-9]+_[a-z0-9_]{1,30}\Z", re.ASCII)
_PYTHON_RE = re.compile(r"\A3\.[0-9]{1,3}\Z", re.ASCII)
_FIELDS = OPENING_FIELDS | {"version", "python", "wheelhouses"}
_TARGET_FIELDS = ("profiles", "device_classes", "device_ids")


def this_platform() -> str:
    """The wheelhouse platform this process runs on: ``linux_x86_64``, ``linux_aarch64``."""
    return f"{sys.platform}_{platform.machine().lower()}"


def this_python() -> str:
    """``MAJOR.MINOR`` of this interpreter: wheels with C extensions are built per version."""
    return f"{sys.version_info.major}.{sys.version_info.minor}"


@dataclass(frozen=True)
class Wheelhouse:
    """One platform's tarball of wheels (the agent's and every dependency's)."""

    platform: str
    artifact: Artifact

    def to_dict(self) -> dict[str, Any]:
        return {"platform": self.platform, **artifact_dict(self.artifact)}


@dataclass(frozen=True)
class AgentManifest:
    version: str
    serial: int
    python: str
    wheelhouses: tuple[Wheelhouse, ...]
    issued_at: datetime
    expires: datetime
    deployment_id: str
    targets: Targets = field(default_factory=Targets)

    def wheelhouse(self, platform_tag: str) -> Wheelhouse | None:
        return next((w for w in self.wheelhouses if w.platform == platform_tag), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": KIND,
            "format": FORMAT,
            "serial": self.serial,
            "version": self.version,
            "python": self.python,
            "wheelhouses": [w.to_dict() for w in self.wheelhouses],
            "targets": {name: list(getattr(self.targets, name)) for name in _TARGET_FIELDS},
            "issued_at": format_time(self.issued_at),
            "expires": format_time(self.expires),
            "deployment_id": self.deployment_id,
        }

    def to_payload(self) -> bytes:
        """The canonical bytes the hub signs (sorted keys, no spaces)."""
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":")).encode("utf-8")

    def describe(self) -> dict[str, str]:
        """The release as the update reports name it (``model`` is ``edgeagent``)."""
        return self.ref().as_dict()

    def ref(self) -> ReleaseRef:
        """The release as outcomes name it (``model`` is ``edgeagent``)."""
        return ReleaseRef("edgeagent", self.version, self.deployment_id)


def claimed_kind(envelope: bytes, max_bytes: int) -> str | None:
    """The ``type`` an envelope's payload *claims*, read unverified: only to route it to the
    verifier of its kind, which then checks it under that kind's own role."""
    try:
        document = loads_strict(decode_envelope(envelope, max_bytes=max_bytes).payload, "kind")
    except TrustError:
        return None
    return text_field(document.get("type")) if is_object(document) else None


def _wheelhouses(reader: Reader, value: Any) -> tuple[Wheelhouse, ...]:
    problem = f"must be a list of 1-{MAX_PLATFORMS} entries"
    found = []
    for index, item in enumerate(reader.items(value, "wheelhouses", 1, MAX_PLATFORMS, problem)):
        artifact = _artifact(item, f"wheelhouses[{index}]", frozenset({"platform"}), reader)
        rule = "a platform such as linux_aarch64"
        found.append(
            Wheelhouse(reader.text(item["platform"], "platform", _PLATFORM_RE, rule), artifact)
        )
    reader.distinct([w.platform for w in found], "wheelhouses", "a platform is listed twice")
    return tuple(found)


def parse_agent_manifest(payload: bytes) -> AgentManifest:
    """Validate every field of an agent release payload; call only on signature-checked bytes."""
    reader, document = read_document(payload, "agent manifest")
    reader.fields(document, _FIELDS)
    form = integer_in(document["format"])
    if document["type"] != KIND or form is None:
        raise reader.fail("type", f"must be {KIND!r} of format {FORMAT}")
    if form != FORMAT:
        raise ManifestError(f"agent manifest format: {form} is not {FORMAT}", "unsupported_format")
    opening = read_opening(reader, document)
    return AgentManifest(
        version=reader.text(document["version"], "version", VERSION_RE, "MAJOR.MINOR.PATCH"),
        serial=opening.serial,
        python=reader.text(
            document["python"], "python", _PYTHON_RE, "a Python version such as 3.11"
        ),
        wheelhouses=_wheelhouses(reader, document["wheelhouses"]),
        issued_at=opening.issued_at,
        expires=opening.expires,
        deployment_id=opening.deployment_id,
        targets=opening.targets,
    )


class AgentHistory(Protocol):
    """What the device remembers of agent releases (``selfupdate.state.AgentRecord``)."""

    def serial_floor(self) -> int | None: ...

    def bad_versions(self) -> set[str]: ...


def check_agent_release(
    manifest: AgentManifest,
    *,
    now: datetime,
    device: DeviceIdentity,
    platform_tag: str,
    python: str,
    serial_floor: int | None,
    bad_versions: Collection[str],
    max_artifact_bytes: int,
    clock_skew_s: float = DEFAULT_CLOCK_SKEW_S,
) -> Wheelhouse:
    """Raise ``Refused`` unless this device may install ``manifest``; return its wheelhouse.

    ``device.agent_version`` (the running agent) is the version floor until a serial was
    committed here; after that the serial is, as for models.
    """
    name = f"agent {manifest.version}"
    if manifest.expires <= now:
        raise Refused(outcomes.EXPIRED, f"{name}: expired at {format_time(manifest.expires)}")
    if manifest.issued_at > now + timedelta(seconds=clock_skew_s):
        raise Refused(
            outcomes.NOT_YET_VALID, f"{name}: issued after this device's time (check clock)"
        )
    mismatch = _target_mismatch(manifest.targets, device)
    if mismatch:
        raise Refused(outcomes.WRONG_TARGET, f"{name}: {mismatch}")
    wheelhouse = manifest.wheelhouse(platform_tag)
    if wheelhouse is None:
        offered = ", ".join(w.platform for w in manifest.wheelhouses)
        raise Refused(
            outcomes.WRONG_PLATFORM, f"{name}: built for {offered}, this is {platform_tag}"
        )
    if manifest.python != python:
        raise Refused(
            outcomes.WRONG_PYTHON, f"{name}: built for Python {manifest.python}, not {python}"
        )
    version, running = version_tuple(manifest.version), version_tuple(device.agent_version)
    if any(version_tuple(bad) == version for bad in bad_versions):
        raise Refused(outcomes.KNOWN_BAD, f"{name}: rolled back here before (failed its switch)")
    if serial_floor is not None:
        if manifest.serial < serial_floor:
            raise Refused(
                outcomes.REPLAY, f"{name}: serial {manifest.serial} is below {serial_floor}"
            )
        if manifest.serial == serial_floor or version == running:
            raise Refused(
                outcomes.SAME_VERSION, f"{name}: already installed (serial {serial_floor})"
            )
    elif version <= running:
        code = outcomes.SAME_VERSION if version == running else outcomes.ROLLBACK
        raise Refused(code, f"{name}: not newer than the running agent {device.agent_version}")
    if wheelhouse.artifact.size > max_artifact_bytes:
        raise Refused(
            outcomes.TOO_LARGE,
            f"{name}: wheelhouse is {wheelhouse.artifact.size} bytes, over the limit of "
            f"{max_artifact_bytes} ([updates] max_artifact_bytes)",
        )
    return wheelhouse


def verify_agent_release(
    envelope: bytes,
    trust: TrustStore,
    *,
    device: DeviceIdentity,
    history: AgentHistory,
    max_artifact_bytes: int,
    clock_skew_s: float = DEFAULT_CLOCK_SKEW_S,
    platform_tag: str | None = None,
    python: str | None = None,
    now: datetime | None = None,
) -> tuple[AgentManifest, Wheelhouse]:
    """Signatures under the ``agent`` role, then parse, then policy; then trust the time.

    Raises a ``TrustError`` (``ReleaseRefused``-like ``AgentRefused`` for an authentic one)
    and changes nothing when it does.
    """
    moment = trust.effective_now(now)
    manifest = parse_agent_manifest(trust.verify(envelope, "agent"))
    try:
        if trust.expires <= moment:
            raise Refused(outcomes.EXPIRED, f"trust file v{trust.version} expired; rotate it")
        wheelhouse = check_agent_release(
            manifest,
            now=moment,
            device=device,
            platform_tag=platform_tag or this_platform(),
            python=python or this_python(),
            serial_floor=history.serial_floor(),
            bad_versions=history.bad_versions(),
            max_artifact_bytes=max_artifact_bytes,
            clock_skew_s=clock_skew_s,
        )
    except Refused as exc:
        raise AgentRefused(exc, manifest) from exc
    trust.record_verified(manifest.issued_at)
    return manifest, wheelhouse


class AgentRefused(Refused):
    """A ``Refused`` for an authentic agent manifest, carried so it can be reported by name."""

    def __init__(self, refused: Refused, manifest: AgentManifest) -> None:
        super().__init__(refused.code, refused.message)
        self.manifest = manifest
