"""A hub simulator for the trust tests (python-tuf's RepositorySimulator, in small).

It holds named Ed25519 keys, builds trust and release payloads as plain dicts that a test may
change one field of, and signs them on demand with any set of keys, so each test states exactly
the one thing it breaks. It uses only ``signing.sign_envelope`` (not the hub code) so that hub
bugs cannot hide device bugs. This module holds no tests itself.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgeagent.fleet.manifest import DeviceIdentity
from edgeagent.fleet.signing import format_time, keyid_of, raw_public_bytes, sign_envelope

NOW = datetime(2026, 6, 1, 12, 0, 0, tzinfo=timezone.utc)
DEVICE = DeviceIdentity(
    device_id="dev-001", profile="generic_x86_64", device_class="x86", agent_version="0.1.0"
)
SHA = "ab" * 32


def dumps(document: Any) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


class Simulator:
    """Keys by name, payload builders with defaults, and signing on demand."""

    def __init__(self, now: datetime = NOW) -> None:
        self.now = now
        self.keys: dict[str, Ed25519PrivateKey] = {}

    def key(self, name: str) -> Ed25519PrivateKey:
        if name not in self.keys:
            self.keys[name] = Ed25519PrivateKey.generate()
        return self.keys[name]

    def keyid(self, name: str) -> str:
        return keyid_of(self.key(name).public_key())

    def trust_doc(
        self,
        version: int = 1,
        root: tuple[str, ...] = ("root",),
        release: tuple[str, ...] = ("release",),
        root_threshold: int = 1,
        release_threshold: int = 1,
        expires: datetime | None = None,
    ) -> dict[str, Any]:
        names = dict.fromkeys(root + release)
        return {
            "type": "trust",
            "version": version,
            "expires": format_time(expires or self.now + timedelta(days=365)),
            "keys": {
                self.keyid(n): {"ed25519": raw_public_bytes(self.key(n).public_key()).hex()}
                for n in names
            },
            "roles": {
                "root": {"keyids": [self.keyid(n) for n in root], "threshold": root_threshold},
                "release": {
                    "keyids": [self.keyid(n) for n in release],
                    "threshold": release_threshold,
                },
            },
        }

    def release_doc(self, **changes: Any) -> dict[str, Any]:
        document: dict[str, Any] = {
            "type": "release",
            "format": 2,
            "serial": 2,
            "model": "digits",
            "version": "2",
            "artifact": {"url": "http://hub.local/digits-2.tar.gz", "size": 4096, "sha256": SHA},
            "variants": [
                {
                    "runtime": "onnxruntime",
                    "precision": "int8",
                    "url": "http://hub.local/digits-2.onnxruntime.int8.tar.gz",
                    "size": 2048,
                    "sha256": SHA,
                }
            ],
            "targets": {"profiles": [], "device_classes": [], "device_ids": []},
            "issued_at": format_time(self.now - timedelta(minutes=5)),
            "expires": format_time(self.now + timedelta(days=7)),
            "deployment_id": "dep-1",
            "min_agent_version": "0.1.0",
        }
        document.update(changes)
        return document

    def sign(self, document: Any, *signers: str) -> bytes:
        payload = document if isinstance(document, bytes) else dumps(document)
        return sign_envelope(payload, [self.key(name) for name in signers])

    def write_trust(self, path: Path, document: dict[str, Any], *signers: str) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(self.sign(document, *(signers or ("root",))))
        return path


class History:
    """The per-model floors and bad versions ``verify_release`` consults (the store's role)."""

    def __init__(
        self,
        floors: dict[str, str] | None = None,
        bad: dict[str, set[str]] | None = None,
        serials: dict[str, int] | None = None,
    ):
        self.floors = floors or {}
        self.bad = bad or {}
        self.serials = serials or {}

    def floor(self, model: str) -> str | None:
        return self.floors.get(model)

    def serial_floor(self, model: str) -> int | None:
        return self.serials.get(model)

    def bad_versions(self, model: str) -> set[str]:
        return self.bad.get(model, set())


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file under ``directory`` with its bytes: the trusted state a refusal must not touch."""
    return {
        str(p.relative_to(directory)): p.read_bytes()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }
