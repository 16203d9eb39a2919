"""What the hub checks before it stores, signs or publishes a release: what every device checks.

A hub that signs (``hub server --release-key``) or retains (``hub publish``) what it was given
turns anything it accepts into something devices install, so it must refuse whatever a device
would refuse — with the device's own code (``TrustStore.verify``, ``parse_manifest``,
``check_release``; for agent releases ``parse_agent_manifest``, ``check_agent_release``),
never a second copy of the rules. Two steps, because the serial floor sits between them: the
server looks it up in its database by the model of the *authentic* manifest.

Two kinds of release travel the channel: models (the ``release`` role) and the agent itself
(the ``agent`` role, whose model name is the reserved ``edgeagent``). An envelope is routed by
the kind its payload *claims*, then verified under that kind's own role only, as the updater
does: a model release key that signs an "agent release" is refused, and so is the reverse.

What the hub cannot judge is left to each device: whether it is one of the release's targets,
its agent version, platform and Python, its own known-bad versions and its artifact size
limit. The device checks are therefore asked as a device the release is for would be asked.
"""

from __future__ import annotations

from datetime import datetime, timezone

from edgeagent.fleet import outcomes
from edgeagent.fleet.agent_manifest import (
    KIND,
    AgentManifest,
    check_agent_release,
    claimed_kind,
    parse_agent_manifest,
)
from edgeagent.fleet.limits import MAX_ENVELOPE_BYTES
from edgeagent.fleet.manifest import (
    DeviceIdentity,
    ReleaseManifest,
    Targets,
    check_release,
    parse_manifest,
)
from edgeagent.fleet.signing import Refused, decode_envelope, format_time
from edgeagent.fleet.trust import TrustStore

AnyRelease = ReleaseManifest | AgentManifest
AGENT_MODEL = "edgeagent"  # the model name of agent releases (``AgentManifest.describe``)


def is_agent(envelope: bytes) -> bool:
    """Whether ``envelope`` claims to be an agent release (unverified: it only picks the role
    the envelope is then verified under)."""
    return claimed_kind(envelope, MAX_ENVELOPE_BYTES) == KIND


def kind_of(manifest: AnyRelease) -> str:
    """``"agent"`` or ``"model"``."""
    return "agent" if isinstance(manifest, AgentManifest) else "model"


def model_of(manifest: AnyRelease) -> str:
    """The model a release is of, as devices report it (``edgeagent`` for the agent)."""
    return AGENT_MODEL if isinstance(manifest, AgentManifest) else manifest.model


def read_manifest(envelope: bytes, *, max_bytes: int = MAX_ENVELOPE_BYTES) -> AnyRelease:
    """The manifest of either kind, signatures *not* checked: for bytes checked before (stored
    by the hub server) or that every device checks itself (relayed unverified); raises
    ``TrustError`` for what is not one."""
    payload = decode_envelope(envelope, max_bytes=max_bytes).payload
    if claimed_kind(envelope, max_bytes) == KIND:
        return parse_agent_manifest(payload)
    return parse_manifest(payload)


def _check_trust_current(trust: TrustStore, now: datetime | None) -> None:
    moment = now or datetime.now(timezone.utc)
    if trust.expires <= moment:
        raise Refused(
            outcomes.EXPIRED,
            f"trust file v{trust.version} expired at {format_time(trust.expires)}; "
            "rotate it (hub rotate) before releasing",
        )


def authentic_release(
    envelope: bytes, trust: TrustStore, *, now: datetime | None = None
) -> ReleaseManifest:
    """The manifest of ``envelope`` once a threshold of ``trust``'s release keys signed it, it
    parses, and the trust file itself has not expired; raises ``TrustError`` (with a code)."""
    manifest = parse_manifest(trust.verify(envelope, "release"))
    _check_trust_current(trust, now)
    return manifest


def authentic_agent_release(
    envelope: bytes, trust: TrustStore, *, now: datetime | None = None
) -> AgentManifest:
    """As ``authentic_release``, for an agent release: a threshold of the *agent* keys."""
    manifest = parse_agent_manifest(trust.verify(envelope, "agent"))
    _check_trust_current(trust, now)
    return manifest


def authentic(envelope: bytes, trust: TrustStore, *, now: datetime | None = None) -> AnyRelease:
    """A release of either kind, verified under its own kind's role (module docstring)."""
    if is_agent(envelope):
        return authentic_agent_release(envelope, trust, now=now)
    return authentic_release(envelope, trust, now=now)


def _targeted(targets: Targets, agent_version: str) -> DeviceIdentity:
    """A device identity the release ``targets``, running ``agent_version``."""
    return DeviceIdentity(
        device_id=next(iter(targets.device_ids), "hub"),
        profile=next(iter(targets.profiles), "hub"),
        device_class=next(iter(targets.device_classes), "hub"),
        agent_version=agent_version,
    )


def check_for_fleet(
    manifest: AnyRelease, *, serial_floor: int | None, now: datetime | None = None
) -> None:
    """Raise ``Refused`` unless devices would take ``manifest`` over a release with serial
    ``serial_floor`` (None: no release of the model yet): its validity window and its serial.

    The device-specific checks pass by construction (see the module docstring): the identity
    is one the release targets, the size limit the release's own largest artifact; an agent
    release is asked as a device of its first platform and its Python, running an agent older
    than any (the running version is each device's own floor before its first serial).
    """
    moment = now or datetime.now(timezone.utc)
    if isinstance(manifest, AgentManifest):
        check_agent_release(
            manifest,
            now=moment,
            device=_targeted(manifest.targets, "0.0.0"),
            platform_tag=manifest.wheelhouses[0].platform,
            python=manifest.python,
            serial_floor=serial_floor,
            bad_versions=(),
            max_artifact_bytes=max(w.artifact.size for w in manifest.wheelhouses),
        )
        return
    artifacts = [manifest.artifact, *(variant.artifact for variant in manifest.variants)]
    check_release(
        manifest,
        now=moment,
        device=_targeted(manifest.targets, manifest.min_agent_version),
        floor=None,
        serial_floor=serial_floor,
        bad_versions=(),
        max_artifact_bytes=max(artifact.size for artifact in artifacts),
    )
