"""Issue 23, finding 1: the hub server was a signing oracle. Started with ``--release-key`` and
no ``--trust`` it re-signed any upload with the fleet's key — a release signed by a stranger
(version 66.6.6, serial 999999, an attacker's artifact URL) reached devices signed by the hub.
Now a signing server cannot start without the trust file, and every upload is checked with the
devices' own code before anything is stored, signed or sent."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from devtools.broker import Broker
from devtools.hub_fleet import MODEL, Api, fleet, hub_server
from devtools.ports import free_port
from edgeagent.fleet.manifest import (
    Artifact,
    DeviceIdentity,
    ReleaseManifest,
    VariantArtifact,
    verify_release,
)
from edgeagent.fleet.signing import sign_envelope
from edgeagent.fleet.trust import TrustStore
from edgeagent.hub.keys import generate_key, keygen, load_private_key

pytestmark = [pytest.mark.broker, pytest.mark.timeout(120)]

NOW = datetime.now(timezone.utc).replace(microsecond=0)


def _release(
    key: Ed25519PrivateKey,
    version: str,
    serial: int,
    *,
    base_url: str = "http://127.0.0.1:9",
    issued: datetime = NOW,
    lifetime: timedelta = timedelta(days=1),
) -> bytes:
    def artifact(name: str) -> Artifact:
        return Artifact(f"{base_url}/{name}", 1000, hashlib.sha256(name.encode()).hexdigest())

    manifest = ReleaseManifest(
        model=MODEL,
        version=version,
        serial=serial,
        artifact=artifact(f"{MODEL}-{version}.tar.gz"),
        variants=(
            VariantArtifact("onnxruntime", "int8", artifact(f"{MODEL}-{version}.int8.tar.gz")),
        ),
        issued_at=issued,
        expires=issued + lifetime,
        deployment_id=f"{MODEL}-{version}-{serial}",
    )
    return sign_envelope(manifest.to_payload(), [key])


class _NoHistory:
    """A device that has installed nothing of the model yet (the attack's best case)."""

    def floor(self, model: str) -> str | None:
        return None

    def serial_floor(self, model: str) -> int | None:
        return None

    def bad_versions(self, model: str) -> set[str]:
        return set()


def _device_installs(envelope: bytes, trust_file: Path, state: Path, device_id: str) -> str:
    """What a device trusting ``trust_file`` does with ``envelope``: the version it would
    install (its own verification code; raises what it would refuse with)."""
    store = TrustStore.load(state / "trust.json", seed=trust_file)
    identity = DeviceIdentity(device_id, "generic-x86_64", "")
    manifest = verify_release(
        envelope, store, device=identity, history=_NoHistory(), max_artifact_bytes=10**6
    )
    return manifest.version


def _files(root: Path) -> set[Path]:
    """Every file under ``root`` but the database's and the broker's (which change by design)."""
    return {
        p
        for p in root.rglob("*")
        if p.is_file() and not p.name.startswith("hub.db") and "broker" not in p.parts
    }


def _server_command(tmp_path: Path, *extra: str) -> list[str]:
    return [
        *(sys.executable, "-m", "edgeagent.cli", "hub", "server"),
        *("--db", f"sqlite:///{tmp_path / 'hub.db'}", "--port", "0"),
        *("--broker", f"127.0.0.1:{free_port()}", *extra),
    ]


def test_a_signing_server_without_the_trust_file_is_refused_at_start(tmp_path: Path) -> None:
    keygen(tmp_path / "keys")
    started = subprocess.run(
        _server_command(tmp_path, "--release-key", str(tmp_path / "keys" / "release.key")),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert started.returncode == 2, started.stdout + started.stderr
    assert "--release-key needs --trust FILE" in started.stderr
    assert not (tmp_path / "hub.db").exists()  # refused before anything was created


def test_a_release_key_the_trust_file_does_not_authorise_is_refused_at_start(
    tmp_path: Path,
) -> None:
    keygen(tmp_path / "keys")
    stranger = generate_key(tmp_path / "other", "release")
    started = subprocess.run(
        _server_command(
            tmp_path,
            *("--release-key", str(stranger.key_path)),
            *("--trust", str(tmp_path / "keys" / "trust.json")),
        ),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert started.returncode == 2, started.stdout + started.stderr
    assert "0 of the keys are release keys of --trust" in started.stderr


async def test_a_forged_upload_is_refused_and_changes_nothing(
    broker: Broker, tmp_path: Path
) -> None:
    keys = tmp_path / "keys"
    keygen(keys)
    trust_file = keys / "trust.json"
    genuine = load_private_key(keys / "release.key")
    stranger = Ed25519PrivateKey.generate()
    settings = broker.settings()
    async with (
        fleet(settings, 2) as devices,
        hub_server(
            f"sqlite:///{tmp_path / 'hub.db'}",
            settings,
            release_keys=(keys / "release.key",),
            trust_file=trust_file,
        ) as url,
    ):
        api = Api(url)
        await api.synced()
        # control: a release signed with the fleet's key is stored, signed, sent, installable
        await api.call("POST", "/api/v1/releases", expect=201, data=_release(genuine, "2.0.0", 5))
        created = await api.call(
            "POST",
            "/api/v1/deployments",
            expect=201,
            json={"model": MODEL, "version": "2.0.0", "group": "lab"},
        )
        done = await api.until(created["id"], "succeeded", "aborted")
        assert done["state"] == "succeeded", done
        for index, device in enumerate(devices):
            (envelope,) = set(device.envelopes)
            state = tmp_path / f"device-{index}"
            assert _device_installs(envelope, trust_file, state, device.topics.device_id) == "2.0.0"
        releases_before = await api.call("GET", "/api/v1/releases")
        files_before = _files(tmp_path)

        attacks = {
            "unknown_key": _release(
                stranger, "66.6.6", 999_999, base_url="http://attacker.example"
            ),
            "replay": _release(genuine, "1.0.0", 4),
            "same_version": _release(genuine, "2.0.1", 5),
            "expired": _release(
                genuine, "3.0.0", 6, issued=NOW - timedelta(days=2), lifetime=timedelta(days=1)
            ),
            "not_yet_valid": _release(genuine, "3.0.0", 6, issued=NOW + timedelta(days=1)),
            "malformed": b'{"payload": "e30=", "signatures": []}',
        }
        for code, envelope in attacks.items():
            refused = await api.call("POST", "/api/v1/releases", expect=422, data=envelope)
            assert code in refused["error"], (code, refused)
        hostile = [b"", b"\x00" * 100, b"[" * 10_000, b'{"payload": 1}', "ž".encode() * 50]
        for body in hostile:
            refused = await api.call("POST", "/api/v1/releases", expect=422, data=body)
            assert refused["error"].startswith("devices would refuse this release"), refused

        assert await api.call("GET", "/api/v1/releases") == releases_before  # no row
        await api.call(
            "POST",
            "/api/v1/deployments",
            expect=404,
            json={"model": MODEL, "version": "66.6.6", "group": "lab"},
        )
        assert _files(tmp_path) == files_before  # no file (no verified-time file either)
    assert [len(d.envelopes) for d in devices] == [1, 1]  # no MQTT message after the control
