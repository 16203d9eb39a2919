"""Delta updates end to end: a device holding the base downloads only the patch; every broken
delta (no base, a wrong base, a truncated patch, a patch giving the right size but the wrong
hash) falls back to the full artifact and the release still commits.

Real hub signing (``sign_package(delta_from=…)``), the real artifact server, the real store and
registry (``test_updates_helpers``).
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

from edgeagent.fleet.agent_manifest import parse_agent_manifest, this_platform
from edgeagent.fleet.artifact import Artifact, read_artifact
from edgeagent.fleet.limits import MAX_ENVELOPE_BYTES
from edgeagent.fleet.manifest import ManifestError, ReleaseManifest, parse_manifest
from edgeagent.fleet.signing import decode_envelope
from edgeagent.fleet.wire import Reader
from edgeagent.hub.agent_release import sign_agent_release
from edgeagent.hub.deltas import make_patch
from edgeagent.hub.keys import keygen
from edgeagent.hub.sign import release_path
from edgeagent.selfupdate.install import unpack_wheelhouse
from tests.integration.test_updates_helpers import (
    Device,
    Hub,
    add_golden,
    device_fixture,  # noqa: F401 - fixture
    hub_fixture,  # noqa: F401 - fixture
)
from tests.unit.test_selfupdate import _wheels


def _manifest(envelope: bytes) -> ReleaseManifest:
    return parse_manifest(decode_envelope(envelope, max_bytes=MAX_ENVELOPE_BYTES).payload)


def _downloaded(device: Device, version: str) -> int:
    step = next(
        e for e in device.events if e.get("step") == "downloaded" and e["version"] == version
    )
    return int(step["bytes"])


async def _v1_then_v2_with_deltas(hub: Hub, device: Device) -> tuple[bytes, ReleaseManifest]:
    """v1 installed in full; v2 (same weights, new version) signed with patches from v1."""
    (hub.keys / "serials.json").write_text('{"tiny": 9}')
    assert (await device.apply(hub.sign(add_golden(hub.package("1", seed=1)))))["result"] == (
        "succeeded"
    )
    v1 = release_path(hub.artifacts, "tiny", "1")
    envelope = hub.sign(add_golden(hub.package("2", seed=1)), delta_from=v1)
    manifest = _manifest(envelope)
    pinned = [manifest.artifact, *(v.artifact for v in manifest.variants)]
    assert all(a.delta is not None for a in pinned), "the hub offers a patch per artifact"
    return envelope, manifest


def _full(manifest: ReleaseManifest) -> int:
    return manifest.artifact.size + sum(v.artifact.size for v in manifest.variants)


async def test_a_device_holding_the_base_downloads_only_the_patches(hub, device) -> None:
    envelope, manifest = await _v1_then_v2_with_deltas(hub, device)
    outcome = await device.apply(envelope)
    assert outcome["result"] == "succeeded", outcome
    assert device.serving() == "2"
    patches = sum(
        a.delta.size for a in [manifest.artifact, *(v.artifact for v in manifest.variants)]
    )
    assert _downloaded(device, "2") == patches < _full(manifest)
    # the committed release's tars are the next bases; v1's are gone
    bases = device.state_dir / "bases" / "tiny"
    assert sorted(p.name for p in bases.iterdir()) == ["2"]
    tars = sorted(p.name for p in (bases / "2").iterdir())
    assert tars == sorted(
        f"{a.delta.tar_sha256}.tar"
        for a in [manifest.artifact, *(v.artifact for v in manifest.variants)]
    )


def _resign(hub: Hub, manifest: ReleaseManifest, variant_artifact: Artifact) -> bytes:
    """``manifest`` with its variant's artifact replaced, signed by the hub's release key."""
    variant = dataclasses.replace(manifest.variants[0], artifact=variant_artifact)
    return hub.signer()(dataclasses.replace(manifest, variants=(variant,)))


def _published_patch(hub: Hub, name: str, data: bytes) -> dict[str, Any]:
    (hub.artifacts / name).write_bytes(data)
    return {
        "url": f"{hub.url}/{name}",
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }


def _no_base(hub: Hub, device: Device, manifest: ReleaseManifest) -> bytes:
    for tar in (device.state_dir / "bases").rglob("*.tar"):
        tar.unlink()
    return hub.signer()(manifest)


def _wrong_base(hub: Hub, device: Device, manifest: ReleaseManifest) -> bytes:
    """The held base's bytes changed on disk: its hash no longer verifies."""
    for tar in (device.state_dir / "bases").rglob("*.tar"):
        data = bytearray(tar.read_bytes())
        data[len(data) // 2] ^= 0xFF
        tar.write_bytes(bytes(data))
    return hub.signer()(manifest)


def _truncated_patch(hub: Hub, device: Device, manifest: ReleaseManifest) -> bytes:
    """A signed patch cut short (its hash is the cut bytes': it downloads, then cannot apply)."""
    artifact = manifest.variants[0].artifact
    assert artifact.delta is not None
    whole = (hub.artifacts / artifact.delta.url.rsplit("/", 1)[-1]).read_bytes()
    pin = _published_patch(hub, "cut.zst", whole[: len(whole) // 2])
    return _resign(
        hub,
        manifest,
        dataclasses.replace(artifact, delta=dataclasses.replace(artifact.delta, **pin)),
    )


def _right_size_wrong_hash(hub: Hub, device: Device, manifest: ReleaseManifest) -> bytes:
    """A patch that yields a tar of the signed size whose bytes differ in one place."""
    artifact = manifest.variants[0].artifact
    assert artifact.delta is not None
    target = bytearray(
        gzip.decompress((hub.artifacts / artifact.url.rsplit("/", 1)[-1]).read_bytes())
    )
    target[len(target) // 3] ^= 0x01
    base = next((device.state_dir / "bases").rglob(f"{artifact.delta.base}.tar")).read_bytes()
    pin = _published_patch(hub, "wrong.zst", make_patch(base, bytes(target)))
    return _resign(
        hub,
        manifest,
        dataclasses.replace(artifact, delta=dataclasses.replace(artifact.delta, **pin)),
    )


@pytest.mark.parametrize(
    "breaks",
    [_no_base, _wrong_base, _truncated_patch, _right_size_wrong_hash],
    ids=lambda f: f.__name__[1:],
)
async def test_a_broken_delta_falls_back_to_the_full_artifact(hub, device, breaks) -> None:
    _envelope, manifest = await _v1_then_v2_with_deltas(hub, device)
    outcome = await device.apply(breaks(hub, device, manifest))
    assert outcome["result"] == "succeeded", outcome
    assert device.serving() == "2"
    variant = manifest.variants[0].artifact
    downloaded = _downloaded(device, "2")
    assert downloaded >= variant.size, "the variant came whole"
    # bytes per device stay within 1.05x of what it installs, a wasted patch included
    assert downloaded <= 1.05 * _full(manifest) + (variant.delta.size if variant.delta else 0)
    assert (device.state_dir / "bases" / "tiny" / "2").is_dir()


def test_a_delta_of_another_algorithm_is_refused_as_malformed() -> None:
    base = {"url": "http://h/a.tar.gz", "size": 3, "sha256": "a" * 64}
    delta = {
        "base": "b" * 64,
        "algorithm": "bsdiff",
        "url": "http://h/a.zst",
        "size": 1,
        "sha256": "c" * 64,
        "tar_size": 9,
        "tar_sha256": "d" * 64,
    }
    reader = Reader("manifest", ManifestError)
    with pytest.raises(ManifestError, match="algorithm"):
        read_artifact(reader, {**base, "delta": delta})
    read = read_artifact(reader, {**base, "delta": {**delta, "algorithm": "zstd-patch"}})
    assert read.delta is not None and read.delta.tar_size == 9


async def test_an_agent_patch_release_ships_only_the_wheel_that_changed(hub, device, tmp_path):
    """Two agent releases whose wheelhouses share a dependency wheel: the second, signed with
    --delta-from the first, reaches a device that installed the first as a small patch, and
    the wheelhouse it rebuilds holds the unchanged wheel byte for byte."""
    keys = tmp_path / "agent-keys"
    keygen(keys, agent_keys=1)
    dependency = os.urandom(256 * 1024)  # incompressible, like a real wheel

    def wheelhouse(version: str) -> Path:
        directory = _wheels(tmp_path / f"wh-{version}", version)
        (directory / "dep-1.0-py3-none-any.whl").write_bytes(dependency)
        return directory

    options = {"key_paths": [keys / "agent.key"], "base_url": hub.url, "out_dir": hub.artifacts}
    first = sign_agent_release({this_platform(): wheelhouse("1.0.0")}, **options)
    second = sign_agent_release({this_platform(): wheelhouse("1.0.1")}, **options, delta_from=first)
    old, new = (
        parse_agent_manifest(decode_envelope(p.read_bytes(), max_bytes=MAX_ENVELOPE_BYTES).payload)
        for p in (first, second)
    )
    house = new.wheelhouses[0].artifact
    assert house.delta is not None and house.delta.size <= 0.05 * house.size

    installer = device.updater.installer
    release = {"model": "edgeagent", "version": "1.0.0", "deployment_id": "agent-1"}
    (await installer.fetch(old.wheelhouses[0].artifact, release)).unlink()
    rebuilt = await installer.fetch(house, {**release, "version": "1.0.1"})
    assert rebuilt.suffix == ".tar"  # patched from the kept base, not downloaded whole
    assert hashlib.sha256(rebuilt.read_bytes()).hexdigest() == house.delta.tar_sha256
    wheels = unpack_wheelhouse(rebuilt, tmp_path / "unpacked", 1 << 24)
    assert (tmp_path / "unpacked" / "dep-1.0-py3-none-any.whl").read_bytes() == dependency
    assert len(wheels) == 2
    kept = device.state_dir / "bases" / "_agent"
    assert sorted(p.name for p in kept.iterdir()) == ["1.0.1"]  # 1.0.0 is not this agent


def test_hub_sign_on_the_command_line_adds_patches_and_a_window(hub) -> None:
    from tests.integration.test_updates_e2e import cli

    (hub.keys / "serials.json").write_text('{"tiny": 9}')
    hub.sign(add_golden(hub.package("1", seed=1)))
    base = release_path(hub.artifacts, "tiny", "1")
    package = add_golden(hub.package("2", seed=1))
    extra = ("--delta-from", str(base), "--window", "Sat,Sun 01:00-05:00")
    done = cli(*hub.sign_command(package, *extra, "--window-timezone", "Europe/Berlin"))
    assert done.returncode == 0, done.stderr
    manifest = _manifest(release_path(hub.artifacts, "tiny", "2").read_bytes())
    assert manifest.window is not None and manifest.window.timezone == "Europe/Berlin"
    assert manifest.variants[0].artifact.delta is not None
    assert (hub.artifacts / manifest.variants[0].artifact.delta.url.rsplit("/", 1)[-1]).is_file()
    refused = cli(*hub.sign_command(package, "--window", "Funday 01:00-02:00"))
    assert refused.returncode != 0 and "--window" in refused.stderr
