"""Hub keygen, rotate and sign, checked through what a device does with their output."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tarfile
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from edgeagent.fleet.manifest import Targets, verify_release
from edgeagent.fleet.signing import TrustError, keyid_of
from edgeagent.fleet.trust import TrustStore
from edgeagent.hub.keys import (
    HubError,
    generate_key,
    keygen,
    load_private_key,
    load_public_key,
    rotate,
    trust_chain,
)
from edgeagent.hub.serials import ReleaseSerials
from edgeagent.hub.sign import SHARED, build_artifacts, sign_package, sign_rollback
from tests.unit.test_trust_sim import DEVICE, History

NOW = datetime.now(timezone.utc).replace(microsecond=0)


@pytest.fixture
def hub(tmp_path: Path) -> Path:
    keygen(tmp_path / "hub", now=NOW)
    return tmp_path / "hub"


def device_trust(hub: Path, tmp_path: Path) -> TrustStore:
    """A device provisioned with the hub's trust.json, as the agent opens it."""
    return TrustStore.load(tmp_path / "device" / "trust.json", seed=hub / "trust.json")


def test_keygen_writes_private_keys_0600_and_a_trust_file(hub: Path) -> None:
    names = sorted(p.name for p in hub.iterdir())
    assert names == ["release.key", "release.pub", "root.key", "root.pub", "trust.json"]
    for key in ("root.key", "release.key"):
        assert stat.S_IMODE((hub / key).stat().st_mode) == 0o600
    trust = TrustStore.load(hub / "trust.json")
    root_id = keyid_of(load_public_key(hub / "root.pub"))
    assert trust.version == 1
    assert trust.root.roles["root"].keyids == {root_id}
    assert trust.expires == NOW + timedelta(days=365)


def test_keygen_never_overwrites(hub: Path) -> None:
    before = (hub / "root.key").read_bytes()
    with pytest.raises(HubError, match="already exists"):
        keygen(hub)
    with pytest.raises(HubError, match="refusing to overwrite"):
        generate_key(hub, "root")
    assert (hub / "root.key").read_bytes() == before


def test_keygen_with_thresholds_and_a_passphrase(tmp_path: Path) -> None:
    result = keygen(
        tmp_path, root_keys=3, root_threshold=2, release_keys=2, passphrase=b"s3cret", now=NOW
    )
    assert [k.name for k in result.keys] == ["root-1", "root-2", "root-3", "release-1", "release-2"]
    trust = TrustStore.load(result.trust_path)
    assert trust.root.roles["root"].threshold == 2
    with pytest.raises(HubError, match="encrypted"):
        load_private_key(tmp_path / "root-1.key")
    with pytest.raises(HubError, match="wrong passphrase"):
        load_private_key(tmp_path / "root-1.key", b"nope")
    assert load_private_key(tmp_path / "root-1.key", b"s3cret")


def test_impossible_threshold_is_refused_before_writing(tmp_path: Path) -> None:
    with pytest.raises(HubError, match="threshold"):
        keygen(tmp_path, release_threshold=2)
    assert not (tmp_path / "trust.json").exists()


def test_private_key_checks(hub: Path, tmp_path: Path) -> None:
    os.chmod(hub / "root.key", 0o644)
    with pytest.raises(HubError, match="chmod 600"):
        load_private_key(hub / "root.key")
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    path = tmp_path / "rsa.key"
    path.write_bytes(
        rsa_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)
    with pytest.raises(HubError, match="Ed25519 key is needed"):
        load_private_key(path)
    with pytest.raises(HubError, match="cannot read"):
        load_private_key(tmp_path / "missing.key")
    with pytest.raises(HubError, match="not a PEM public key"):
        load_public_key(hub / "trust.json")


# --- sign ---------------------------------------------------------------------------------


def test_signed_release_is_accepted_by_a_device(hub: Path, tiny_package: Path, tmp_path) -> None:
    artifact, envelope_path = sign_package(
        tiny_package,
        key_paths=[hub / "release.key"],
        base_url="http://hub.local:8000/releases/",
        out_dir=tmp_path / "out",
        targets=Targets(device_classes=("x86",)),
        deployment_id="dep-42",
        trust_path=hub / "trust.json",
        now=NOW,
    )
    assert artifact.name == "tiny-1.tar.gz"
    assert envelope_path.name == "tiny-1.release.json"
    manifest = verify_release(
        envelope_path.read_bytes(),
        device_trust(hub, tmp_path),
        device=DEVICE,
        history=History(),
        max_artifact_bytes=1 << 20,
        now=NOW,
    )
    assert manifest.artifact.url == "http://hub.local:8000/releases/tiny-1.tar.gz"
    assert manifest.artifact.size == artifact.stat().st_size
    assert manifest.artifact.sha256 == hashlib.sha256(artifact.read_bytes()).hexdigest()
    [variant] = manifest.variants
    variant_file = tmp_path / "out" / "tiny-1.onnxruntime.fp32.tar.gz"
    assert (variant.runtime, variant.precision) == ("onnxruntime", "fp32")
    assert variant.artifact.url == f"http://hub.local:8000/releases/{variant_file.name}"
    assert variant.artifact.size == variant_file.stat().st_size
    assert variant.artifact.sha256 == hashlib.sha256(variant_file.read_bytes()).hexdigest()
    with tarfile.open(artifact) as shared, tarfile.open(variant_file) as files:
        assert shared.getnames() == ["labels.txt", "model.toml"]  # no variant file
        assert files.getnames() == ["tiny.fp32.onnx"]
    assert manifest.serial == 1 and json.loads((hub / "serials.json").read_text()) == {"tiny": 1}
    assert manifest.deployment_id == "dep-42"
    assert manifest.targets.device_classes == ("x86",)
    assert manifest.expires == NOW + timedelta(days=30)


def test_artifact_is_reproducible_and_clean(tiny_package: Path, tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first, _ = build_artifacts(tiny_package, tmp_path / "a")
    os.utime(tiny_package / "labels.txt", (1, 1))  # touching files changes nothing
    second, _ = build_artifacts(tiny_package, tmp_path / "b")
    assert sorted(first) == ["onnxruntime/fp32", SHARED]
    assert all(first[key].read_bytes() == second[key].read_bytes() for key in first)
    with tarfile.open(first[SHARED]) as archive:
        members = archive.getmembers()
    names = [m.name for m in members]
    assert names == sorted(names)
    assert "model.toml" in names and not any(n.startswith(("/", "..", "tiny/")) for n in names)
    for member in members:
        assert (member.mtime, member.uid, member.gid, member.uname, member.gname) == (
            0,
            0,
            0,
            "",
            "",
        )
        assert member.isfile() or member.isdir()


def test_links_in_a_package_are_refused(tiny_package: Path, tmp_path: Path) -> None:
    (tiny_package / "extra").symlink_to("/etc/passwd")
    with pytest.raises(HubError, match="links and special files"):
        build_artifacts(tiny_package, tmp_path)
    assert not list(tmp_path.glob("*.tar.gz"))


def test_invalid_package_is_refused_with_its_reason(tiny_package: Path, tmp_path: Path) -> None:
    (tiny_package / "labels.txt").unlink()
    with pytest.raises(HubError, match="labels"):
        build_artifacts(tiny_package, tmp_path / "out")


def test_signing_with_a_key_the_fleet_does_not_trust(hub, tiny_package, tmp_path) -> None:
    generate_key(tmp_path / "other", "stray")
    with pytest.raises(HubError, match="unknown_key"):
        sign_package(
            tiny_package,
            key_paths=[tmp_path / "other" / "stray.key"],
            base_url="http://hub.local",
            out_dir=tmp_path / "out",
            trust_path=hub / "trust.json",
        )
    assert not (tmp_path / "out").exists()  # neither artifact nor envelope


def test_a_released_artifact_is_never_replaced(hub, tiny_package: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    sign = dict(
        key_paths=[hub / "release.key"], base_url="http://h", out_dir=out, replace_artifact=False
    )
    artifact, _ = sign_package(tiny_package, **sign)
    sign_package(tiny_package, **sign)  # same bytes again: fine (reproducible)
    before = artifact.read_bytes()
    (tiny_package / "labels.txt").write_text("".join(f"other_{i}\n" for i in range(4)))
    with pytest.raises(HubError, match="raise the version"):
        sign_package(tiny_package, **sign)
    assert artifact.read_bytes() == before
    sign_package(tiny_package, **{**sign, "replace_artifact": True})  # forced
    assert artifact.read_bytes() != before


def test_bad_release_fields_are_refused_at_signing(hub, tiny_package, tmp_path) -> None:
    with pytest.raises(HubError, match="artifact.url"):
        sign_package(
            tiny_package, key_paths=[hub / "release.key"], base_url="ftp://x", out_dir=tmp_path
        )
    with pytest.raises(HubError, match="deployment_id"):
        sign_package(
            tiny_package,
            key_paths=[hub / "release.key"],
            base_url="http://x",
            out_dir=tmp_path,
            deployment_id="has space",
        )


# --- rotate -------------------------------------------------------------------------------


def test_rotate_release_key_then_root_key(hub: Path, tiny_package: Path, tmp_path: Path) -> None:
    device = device_trust(hub, tmp_path)
    generate_key(hub, "release2")
    v2 = rotate(
        hub / "trust.json", old_root_keys=[hub / "root.key"], release_pubs=[hub / "release2.pub"]
    )
    device = device.rotate(v2.read_bytes())
    assert device.version == 2
    generate_key(hub, "root2")
    rotate(hub / "trust.json", old_root_keys=[hub / "root.key"], new_root_keys=[hub / "root2.key"])
    device = device.rotate((hub / "trust.json").read_bytes())
    assert device.root.roles["root"].keyids == {keyid_of(load_public_key(hub / "root2.pub"))}
    assert TrustStore.load(tmp_path / "device" / "trust.json").version == 3

    _, old_release = sign_package(
        tiny_package, key_paths=[hub / "release.key"], base_url="http://h", out_dir=tmp_path / "o"
    )
    with pytest.raises(TrustError) as info:
        device.verify(old_release.read_bytes())
    assert info.value.code == "unknown_key"


def test_rotate_with_a_key_that_is_not_root_writes_nothing(hub: Path) -> None:
    before = (hub / "trust.json").read_bytes()
    with pytest.raises(HubError, match="devices would refuse"):
        rotate(hub / "trust.json", old_root_keys=[hub / "release.key"])
    assert (hub / "trust.json").read_bytes() == before


def test_rotate_to_a_separate_file(hub: Path, tmp_path: Path) -> None:
    out = rotate(
        hub / "trust.json",
        old_root_keys=[hub / "root.key"],
        out_path=tmp_path / "trust-v2.json",
        expires_in=timedelta(days=10),
        now=NOW,
    )
    assert TrustStore.load(out).version == 2
    assert TrustStore.load(out).expires == NOW + timedelta(days=10)
    assert TrustStore.load(hub / "trust.json").version == 1


def test_trust_chain_lets_a_sleeping_device_catch_up(hub: Path, tmp_path: Path) -> None:
    device = device_trust(hub, tmp_path)
    with pytest.raises(HubError, match="no rotated trust files"):
        trust_chain(hub / "trust.json")
    for name in ("root2", "root3"):
        generate_key(hub, name)
    rotate(hub / "trust.json", old_root_keys=[hub / "root.key"], new_root_keys=[hub / "root2.key"])
    rotate(hub / "trust.json", old_root_keys=[hub / "root2.key"], new_root_keys=[hub / "root3.key"])
    assert sorted(p.name for p in hub.glob("trust.v*.json")) == ["trust.v2.json", "trust.v3.json"]
    device = device.update(trust_chain(hub / "trust.json"))
    assert device.version == 3
    assert TrustStore.load(tmp_path / "device" / "trust.json").version == 3


# --- release serials and rollback ------------------------------------------------------------


def test_serials_count_per_model_and_persist(tmp_path: Path) -> None:
    serials = ReleaseSerials(tmp_path / "serials.json")
    assert [serials.next("a"), serials.next("a"), serials.next("b")] == [1, 2, 1]
    assert ReleaseSerials(tmp_path / "serials.json").last("a") == 2


@pytest.mark.parametrize("content", ["{not json", '{"a": -1}', '{"a": true}', "[1]"])
def test_a_corrupt_serials_file_is_refused_not_reset(tmp_path: Path, content: str) -> None:
    (tmp_path / "serials.json").write_text(content)
    with pytest.raises(HubError, match="serials"):
        ReleaseSerials(tmp_path / "serials.json").next("a")
    assert (tmp_path / "serials.json").read_text() == content


def test_rollback_re_signs_the_kept_release_with_the_next_serial(
    hub: Path, tiny_package: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    options = {"key_paths": [hub / "release.key"], "base_url": "http://h", "out_dir": out}
    sign_package(tiny_package, **options)
    newer = tiny_package.parent / "tiny-2"
    shutil.copytree(tiny_package, newer)
    toml = newer / "model.toml"
    toml.write_text(toml.read_text().replace('version = "1"', 'version = "2"'))
    sign_package(newer, **options)
    manifest, envelope = sign_rollback(
        "tiny", "1", key_paths=[hub / "release.key"], out_dir=out, trust_path=hub / "trust.json"
    )
    assert (manifest.version, manifest.serial) == ("1", 3)
    assert "rollback" in manifest.deployment_id
    assert (out / "tiny-1.release.json").read_bytes() == envelope


def test_rollback_refuses_when_the_kept_artifact_is_gone_or_changed(
    hub: Path, tiny_package: Path, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    sign_package(tiny_package, key_paths=[hub / "release.key"], base_url="http://h", out_dir=out)
    keys = [hub / "release.key"]
    with pytest.raises(HubError, match="no kept release of tiny 7"):
        sign_rollback("tiny", "7", key_paths=keys, out_dir=out)
    (out / "tiny-1.onnxruntime.fp32.tar.gz").write_bytes(b"other bytes")
    before = (hub / "serials.json").read_text()
    with pytest.raises(HubError, match="no longer the signed artifact"):
        sign_rollback("tiny", "1", key_paths=keys, out_dir=out)
    (out / "tiny-1.onnxruntime.fp32.tar.gz").unlink()
    with pytest.raises(HubError, match="is gone"):
        sign_rollback("tiny", "1", key_paths=keys, out_dir=out)
    assert (hub / "serials.json").read_text() == before  # no serial spent on a refusal


def test_a_large_model_file_is_archived_from_disk_not_held_in_memory(
    hub: Path, tmp_path: Path
) -> None:
    """A GGUF of gigabytes must not pass through memory whole: the artifacts are streamed to
    disk (and hashed from there), so signing's Python heap stays far below the file's size."""
    import tracemalloc

    from edgeagent.models.manifest_writer import write_table
    from tests.support.language import text_table

    package = tmp_path / "big"
    package.mkdir()
    table = text_table("big")
    table["variant"][0]["files"] = ["big.gguf"]
    write_table(package, table)
    size = 24 << 20
    (package / "big.gguf").write_bytes(os.urandom(size))  # incompressible
    tracemalloc.start()
    try:
        shared, envelope = sign_package(
            package,
            key_paths=[hub / "release.key"],
            base_url="http://hub.local",
            out_dir=tmp_path / "out",
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < size // 4, f"signing held {peak >> 20} MiB for a {size >> 20} MiB file"
    variant = tmp_path / "out" / "big-1.0.0.llama_cpp.q4_1.tar.gz"
    with tarfile.open(variant) as archive:
        member = archive.extractfile("big.gguf")
        assert member is not None
        assert (
            hashlib.sha256(member.read()).digest()
            == hashlib.sha256((package / "big.gguf").read_bytes()).digest()
        )
    assert envelope.is_file() and shared.is_file()
    assert not list(tmp_path.glob(".edgeagent-archives-*"))  # the working folder is gone
