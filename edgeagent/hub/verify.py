"""What the hub checks before it stores, signs or publishes a release: what every device checks.

A hub that signs (``hub server --release-key``) or retains (``hub publish``) what it was given
turns anything it accepts into something devices install, so it must refuse whatever a device
would refuse — with the device's own code (``TrustStore.verify``, ``parse_manifest``,
``check_release``), never a second copy of the rules. Two steps, because the serial floor sits
between them: the server looks it up in its database by the model of the *authentic* manifest.

What the hub cannot judge is left to each device: whether it is one of the release's targets,
its agent version, its own known-bad versions and its artifact size limit. ``check_release``
is therefore asked as a device the release is for would be asked.
"""

from __future__ import annotations

from datetime import datetime, timezone

from edgeagent.fleet.manifest import (
    DeviceIdentity,
    ReleaseManifest,
    check_release,
    parse_manifest,
)
from edgeagent.fleet.signing import Refused, format_time
from edgeagent.fleet.trust import TrustStore


def authentic_release(
    envelope: bytes, trust: TrustStore, *, now: datetime | None = None
) -> ReleaseManifest:
    """The manifest of ``envelope`` once a threshold of ``trust``'s release keys signed it, it
    parses, and the trust file itself has not expired; raises ``TrustError`` (with a code)."""
    manifest = parse_manifest(trust.verify(envelope, "release"))
    moment = now or datetime.now(timezone.utc)
    if trust.expires <= moment:
        raise Refused(
            "expired",
            f"trust file v{trust.version} expired at {format_time(trust.expires)}; "
            "rotate it (hub rotate) before releasing",
        )
    return manifest


def check_for_fleet(
    manifest: ReleaseManifest, *, serial_floor: int | None, now: datetime | None = None
) -> None:
    """Raise ``Refused`` unless devices would take ``manifest`` over a release with serial
    ``serial_floor`` (None: no release of the model yet): its validity window and its serial.

    The device-specific checks pass by construction (see the module docstring): the identity
    is one the release targets, the size limit the release's own largest artifact.
    """
    targets = manifest.targets
    device = DeviceIdentity(
        device_id=next(iter(targets.device_ids), "hub"),
        profile=next(iter(targets.profiles), "hub"),
        device_class=next(iter(targets.device_classes), "hub"),
        agent_version=manifest.min_agent_version,
    )
    artifacts = [manifest.artifact, *(variant.artifact for variant in manifest.variants)]
    check_release(
        manifest,
        now=now or datetime.now(timezone.utc),
        device=device,
        floor=None,
        serial_floor=serial_floor,
        bad_versions=(),
        max_artifact_bytes=max(artifact.size for artifact in artifacts),
    )
