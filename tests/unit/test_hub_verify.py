"""``hub.release_checks``: the hub asks the devices' own checks, and only those it can answer
for every device — a release for some devices (targets, a newer agent) is not the hub's to
refuse."""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgeagent.fleet.manifest import Artifact, ReleaseManifest, Targets, VariantArtifact
from edgeagent.fleet.signing import Refused, TrustError, sign_envelope
from edgeagent.fleet.trust import TrustStore
from edgeagent.hub.keys import keygen, load_private_key
from edgeagent.hub.release_checks import authentic_release, check_for_fleet

NOW = datetime(2030, 1, 1, tzinfo=timezone.utc)


def _manifest(serial: int = 5, **changes: object) -> ReleaseManifest:
    artifact = Artifact("http://hub/tiny-2.tar.gz", 10, hashlib.sha256(b"").hexdigest())
    fields: dict = {
        "model": "tiny",
        "version": "2",
        "serial": serial,
        "artifact": artifact,
        "variants": (VariantArtifact("onnxruntime", "fp32", artifact),),
        "issued_at": NOW,
        "expires": NOW + timedelta(days=1),
        "deployment_id": "tiny-2",
        **changes,
    }
    return ReleaseManifest(**fields)


def test_a_release_for_some_devices_or_a_newer_agent_is_not_the_hubs_to_refuse() -> None:
    targeted = _manifest(
        targets=Targets(profiles=("rpi5",), device_classes=("cam",), device_ids=("dev-7",)),
        min_agent_version="99.0.0",
    )
    check_for_fleet(targeted, serial_floor=4, now=NOW)


@pytest.mark.parametrize(
    ("manifest", "floor", "code"),
    [
        (_manifest(serial=4), 5, "replay"),
        (_manifest(serial=5), 5, "same_version"),
        (_manifest(expires=NOW), None, "expired"),
        (_manifest(issued_at=NOW + timedelta(hours=1)), None, "not_yet_valid"),
    ],
)
def test_what_every_device_refuses_the_hub_refuses(
    manifest: ReleaseManifest, floor: int | None, code: str
) -> None:
    with pytest.raises(Refused) as refused:
        check_for_fleet(manifest, serial_floor=floor, now=NOW)
    assert refused.value.code == code


def test_a_stranger_key_and_an_expired_trust_file_are_refused(tmp_path: Path) -> None:
    keygen(tmp_path, now=NOW - timedelta(days=1), expires_in=timedelta(days=2))
    trust = TrustStore.load(tmp_path / "trust.json")
    payload = _manifest().to_payload()
    genuine = sign_envelope(payload, [load_private_key(tmp_path / "release.key")])
    assert authentic_release(genuine, trust, now=NOW).serial == 5
    with pytest.raises(TrustError) as stranger:
        authentic_release(sign_envelope(payload, [Ed25519PrivateKey.generate()]), trust, now=NOW)
    assert stranger.value.code == "unknown_key"
    with pytest.raises(Refused) as expired:
        authentic_release(genuine, trust, now=NOW + timedelta(days=2))
    assert expired.value.code == "expired" and "trust file v1 expired" in expired.value.message
