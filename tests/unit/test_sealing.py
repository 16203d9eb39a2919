"""Sealed models below the updater: the crypto, the device key file, the manifest field, and
every runtime loading a sealed zoo variant from memory."""

from __future__ import annotations

import dataclasses
import os
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

from edgeagent.fleet.limits import MAX_ENVELOPE_BYTES
from edgeagent.fleet.manifest import ManifestError, Targets, parse_manifest
from edgeagent.fleet.signing import decode_envelope
from edgeagent.hub.encrypt import load_recipients
from edgeagent.hub.keys import HubError, keygen
from edgeagent.hub.sign import archive_package, sign_package
from edgeagent.models.device_key import (
    DEVICE_KEY_FILE,
    PUBLIC_KEY_FILE,
    DeviceKeyError,
    open_device_key,
)
from edgeagent.models.golden import sample_feeds
from edgeagent.models.package import WRAPPED_KEY, load_package, sealed_dir
from edgeagent.models.seal_crypto import (
    SealingError,
    identity,
    new_content_key,
    public_key_text,
    seal,
    unseal,
    unwrap_key,
    wrap_key,
)
from edgeagent.models.session import load_request, open_variant
from edgeagent.models.unsealer import SealedError, Unsealer
from edgeagent.runtimes import get_runtime
from tests.support.helpers import write_tiny_package

ZOO = Path(__file__).resolve().parents[2] / "zoo" / "digits_mnv3"
RELEASE = identity("m", "1", "onnxruntime/fp32")


def test_a_sealed_blob_opens_only_unaltered_with_its_key_and_associated_data() -> None:
    key = new_content_key()
    sealed = seal(key, b"weights" * 100, RELEASE)
    assert unseal(key, sealed, RELEASE, "f") == b"weights" * 100
    assert b"weights" not in sealed
    flipped = bytearray(sealed)
    flipped[-20] ^= 1
    for bad_key, blob, aad in (
        (key, bytes(flipped), RELEASE),
        (new_content_key(), sealed, RELEASE),
        (key, sealed, identity("m", "2", "onnxruntime/fp32")),  # another release's identity
    ):
        with pytest.raises(SealingError, match="does not authenticate"):
            unseal(bad_key, blob, aad, "f")
    with pytest.raises(SealingError, match="not a sealed model file"):
        unseal(key, b"plain onnx bytes", RELEASE, "f")


def test_a_wrapped_key_unwraps_only_with_the_recipient_key_for_the_same_release() -> None:
    device, other = X25519PrivateKey.generate(), X25519PrivateKey.generate()
    content = new_content_key()
    wrapped = wrap_key(content, device.public_key(), RELEASE)
    assert len(wrapped) == 92 and unwrap_key(wrapped, device, RELEASE) == content
    with pytest.raises(SealingError, match="not wrapped for this device's key"):
        unwrap_key(wrapped, other, RELEASE)
    with pytest.raises(SealingError):
        unwrap_key(wrapped, device, identity("m", "1", "litert/fp32"))
    with pytest.raises(SealingError, match="92 bytes"):
        unwrap_key(wrapped[:-1], device, RELEASE)


def test_the_device_key_is_created_0600_and_reused(tmp_path: Path) -> None:
    first = open_device_key(tmp_path / "state")
    path = tmp_path / "state" / DEVICE_KEY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    again = open_device_key(tmp_path / "state")
    assert again.public_text == first.public_text
    assert public_key_text(again.private.public_key()) == first.public_text
    # no temp file left; the public half beside the key, for reporting without the crypto
    assert sorted(p.name for p in path.parent.iterdir()) == [DEVICE_KEY_FILE, PUBLIC_KEY_FILE]


def test_an_agent_without_sealed_models_never_loads_the_crypto_library(tmp_path: Path) -> None:
    """Reporting the key needs only the stored public half: cryptography stays unloaded."""
    state = tmp_path / "state"
    created = open_device_key(state).public_text
    script = (
        "import sys; from edgeagent.models.device_key import open_device_key; "
        "import edgeagent.daemon; "
        "print(open_device_key(sys.argv[1]).status()['public_key'], "
        "'cryptography' in sys.modules)"
    )
    shown = subprocess.run(
        [sys.executable, "-c", script, str(state)], capture_output=True, text=True, check=True
    )
    assert shown.stdout.split() == [created, "False"]


def test_a_missing_or_mangled_public_half_is_derived_again(tmp_path: Path) -> None:
    created = open_device_key(tmp_path).public_text
    public = tmp_path / PUBLIC_KEY_FILE
    for damage in (public.unlink, lambda: public.write_text("not base64!")):
        damage()
        assert open_device_key(tmp_path).public_text == created
        assert public.read_text().strip() == created


def test_a_new_key_pair_replaces_the_public_half_of_the_old_one(tmp_path: Path) -> None:
    old = open_device_key(tmp_path).public_text
    (tmp_path / DEVICE_KEY_FILE).unlink()  # the documented way to make a new pair
    new = open_device_key(tmp_path)
    assert new.public_text != old
    assert public_key_text(new.private.public_key()) == new.public_text
    assert (tmp_path / PUBLIC_KEY_FILE).read_text().strip() == new.public_text


def test_a_public_half_of_another_key_is_caught_when_the_key_is_used(tmp_path: Path) -> None:
    open_device_key(tmp_path)
    other = open_device_key(tmp_path / "other").public_text
    (tmp_path / PUBLIC_KEY_FILE).write_text(other + "\n")
    key = open_device_key(tmp_path)
    with pytest.raises(DeviceKeyError, match="does not hold the public half"):
        _ = key.private


def test_an_unusable_device_key_file_is_a_clear_error_and_is_never_replaced(
    tmp_path: Path,
) -> None:
    path = tmp_path / DEVICE_KEY_FILE
    path.write_bytes(b"not a key")
    os.chmod(path, 0o600)
    with pytest.raises(DeviceKeyError, match="not a PEM private key"):
        open_device_key(tmp_path)
    assert path.read_bytes() == b"not a key"
    open_device_key(tmp_path / "good")
    good = tmp_path / "good" / DEVICE_KEY_FILE
    os.chmod(good, 0o644)
    with pytest.raises(DeviceKeyError, match="chmod 600"):
        open_device_key(tmp_path / "good")


def test_a_recipients_file_with_a_bad_key_names_the_device(tmp_path: Path) -> None:
    path = tmp_path / "recipients.toml"
    path.write_text('"dev-1" = "AAAA"\n')
    with pytest.raises(HubError, match="dev-1.*not an X25519 public key"):
        load_recipients(path)


# extractall's filter= came with Python 3.11.4 (and 3.10.12); Debian bookworm and Raspberry Pi
# OS bookworm ship 3.11.2, where it is a TypeError. These archives are the test's own.
SAFE_EXTRACT: dict[str, str] = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}


def _sealed_zoo(tmp_path: Path, device: X25519PrivateKey, device_id: str = "dev-1") -> Path:
    """The digits zoo package as a device installs it sealed: shared files plain, each
    variant's files under sealed/, its key wrapped for ``device``."""
    archives = archive_package(ZOO, tmp_path, {device_id: device.public_key()})
    root = tmp_path / "installed"
    for artifact in archives.data().values():
        with tarfile.open(artifact.path, mode="r:gz") as archive:
            archive.extractall(root, **SAFE_EXTRACT)
    for key, encryption in archives.encryption.items():
        (sealed_dir(root, key) / WRAPPED_KEY).write_bytes(encryption.recipients[device_id])
    return root


def test_every_runtime_loads_a_sealed_variant_from_memory_with_the_answers_of_the_plain_one(
    tmp_path: Path,
) -> None:
    device = X25519PrivateKey.generate()
    package = load_package(_sealed_zoo(tmp_path, device))
    plain = load_package(ZOO)
    feeds = sample_feeds(plain)
    unsealer = Unsealer(lambda: device)
    assert {v.runtime for v in package.variants} == {"onnxruntime", "litert", "openvino"}
    for variant in package.variants:
        assert variant.sealed_files and not any(f.exists() for f in variant.files)
        request = load_request(package, variant, cache_dir=tmp_path / "cache", unsealer=unsealer)
        assert request.cache_dir is None and request.contents is not None
        session = get_runtime(variant.runtime).load(request)
        reference = open_variant(plain, variant.runtime, variant.precision)
        expected = reference.run(feeds)
        for name, value in session.run(feeds).items():
            np.testing.assert_allclose(value, expected[name], rtol=1e-4, atol=1e-4)
    assert not (tmp_path / "cache").exists()
    assert package.content_hash() != plain.content_hash()  # probe cache keyed by ciphertext


def test_a_sealed_variant_without_the_key_or_altered_does_not_load(tmp_path: Path) -> None:
    device = X25519PrivateKey.generate()
    package = load_package(_sealed_zoo(tmp_path, device))
    variant = package.variant("onnxruntime", "fp32")
    assert variant is not None
    with pytest.raises(SealedError, match="only an agent holding the device key"):
        load_request(package, variant)
    with pytest.raises(SealedError, match="not wrapped for this device's key"):
        load_request(package, variant, unsealer=Unsealer(X25519PrivateKey.generate))
    stored = variant.sealed_files[0]
    data = bytearray(stored.read_bytes())
    data[len(data) // 2] ^= 0xFF
    stored.write_bytes(bytes(data))
    with pytest.raises(SealedError, match="does not authenticate"):
        load_request(package, variant, unsealer=Unsealer(lambda: device))


def _sign(tmp_path: Path, **options) -> Path:
    """``sign_package`` of the tiny package with fresh keys; returns the envelope's path."""
    keygen(tmp_path / "keys")
    _, envelope = sign_package(
        write_tiny_package(tmp_path / "tiny", "tiny", "1"),
        key_paths=[tmp_path / "keys" / "release.key"],
        base_url="http://hub.test",
        out_dir=tmp_path / "out",
        **options,
    )
    return envelope


def test_the_signed_manifest_carries_wrapped_keys_and_refuses_malformed_ones(
    tmp_path: Path,
) -> None:
    device = X25519PrivateKey.generate()
    envelope = _sign(tmp_path, recipients={"dev-1": device.public_key()})
    signed = decode_envelope(envelope.read_bytes(), max_bytes=MAX_ENVELOPE_BYTES).payload
    manifest = parse_manifest(signed)
    variant = manifest.variants[0]
    assert variant.artifact.url.endswith(".onnxruntime.fp32.sealed.tar.gz")
    assert variant.encryption is not None and variant.encryption.wrapped_for("dev-2") is None
    wrapped = variant.encryption.wrapped_for("dev-1")
    assert wrapped is not None
    assert len(unwrap_key(wrapped, device, identity("tiny", "1", variant.key))) == 32
    assert parse_manifest(manifest.to_payload()) == manifest
    short = dataclasses.replace(variant.encryption, recipients={"dev-1": b"short"})
    bad = dataclasses.replace(manifest, variants=(dataclasses.replace(variant, encryption=short),))
    with pytest.raises(ManifestError, match="not a wrapped key"):
        parse_manifest(bad.to_payload())


def test_a_release_for_target_devices_needs_a_key_for_each(tmp_path: Path) -> None:
    with pytest.raises(HubError, match="no public key for target device.*dev-2"):
        _sign(
            tmp_path,
            targets=Targets(device_ids=("dev-1", "dev-2")),
            recipients={"dev-1": X25519PrivateKey.generate().public_key()},
        )
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_a_release_sealed_for_more_devices_than_an_envelope_holds_is_refused(
    tmp_path: Path,
) -> None:
    key = X25519PrivateKey.generate().public_key()
    with pytest.raises(HubError, match="seal it for fewer devices"):
        _sign(tmp_path, recipients={f"dev-{n}": key for n in range(600)})
