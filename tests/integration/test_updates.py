"""The updater state machine end to end in one process: install, attacks, health-gate rollback.

Every refusal must name its reason and leave the store (floors, bad list, current pointers,
installed versions, pending record) exactly as it was — python-tuf's test discipline.
"""

from __future__ import annotations

import base64
import json
import tarfile
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone

import pytest

from devtools.pki import make_pki
from edgeagent.fleet.manifest import Targets
from edgeagent.fleet.signing import sign_envelope
from edgeagent.hub.keys import generate_key, keygen
from edgeagent.hub.serials import ReleaseSerials
from edgeagent.hub.serve import server_tls, start_artifact_server
from tests.integration.test_updates_helpers import (
    Device,
    Hub,
    add_golden,
    break_model,
    device_fixture,  # noqa: F401 - fixture
    hostile_archive,
    hub_fixture,  # noqa: F401 - fixture
    load_private_key,
    make_device,
)


async def _serving_v1(hub: Hub, device: Device) -> dict:
    (hub.keys / "serials.json").write_text('{"tiny": 9}')  # a hub that has released before
    outcome = await device.apply(hub.release("1"))
    assert outcome["result"] == "succeeded", outcome
    assert device.serving() == "1"
    return device.store.snapshot()


async def test_first_install_then_upgrade_commits_and_raises_the_floor(hub, device) -> None:
    await _serving_v1(hub, device)
    outcome = await device.apply(hub.release("2"))
    assert outcome["result"] == "succeeded" and outcome["deployment_id"].startswith("tiny-2-")
    assert device.serving() == "2"
    assert device.store.current("tiny") == "2" and device.store.floor("tiny") == "2"
    assert device.store.pending() is None
    steps = [e["step"] for e in device.events if e.get("version") == "2"]
    assert steps[0] == "verified" and steps[-1] == "done"
    assert {"downloading", "unpacked", "installed", "activated"} <= set(steps)


async def test_old_releases_are_garbage_collected(hub, device) -> None:
    for version in ("1", "2", "3", "4"):
        assert (await device.apply(hub.release(version)))["result"] == "succeeded"
    assert device.store.versions("tiny") == ["2", "3", "4"]  # current + keep_releases=2


async def test_a_resent_committed_envelope_is_answered_same_version(hub, device) -> None:
    """Issue 23: the hub re-sends the exact bytes and waits for an answer; the device says
    ``same_version`` and reinstalls nothing (the saved outcome stays the commit)."""
    envelope = hub.release("1")
    committed = await device.apply(envelope)
    before = device.store.snapshot()
    answer = await device.apply(envelope)
    assert (answer["result"], answer["code"]) == ("refused", "same_version"), answer
    assert answer["deployment_id"] == committed["deployment_id"]
    assert device.events[-1]["code"] == "same_version"
    assert device.updater.reporter.last == committed  # an event only: history unchanged
    assert device.store.snapshot() == before and device.serving() == "1"


def _tamper(hub: Hub) -> bytes:
    envelope = hub.release("2")
    artifact = next(hub.artifacts.glob("tiny-2*.tar.gz"))
    data = bytearray(artifact.read_bytes())
    data[len(data) // 2] ^= 0xFF
    artifact.write_bytes(bytes(data))
    return envelope


def _truncate(hub: Hub) -> bytes:
    envelope = hub.release("2")
    artifact = next(hub.artifacts.glob("tiny-2*.tar.gz"))
    artifact.write_bytes(artifact.read_bytes()[:-100])
    return envelope


def _wrong_key(hub: Hub) -> bytes:
    pair = generate_key(hub.root / "rogue", "release")
    return hub.release("2", key_paths=[pair.key_path])


def _bad_signature(hub: Hub) -> bytes:
    envelope = json.loads(hub.release("2"))
    signature = bytearray(base64.b64decode(envelope["signatures"][0]["sig"]))
    signature[0] ^= 0x01
    envelope["signatures"][0]["sig"] = base64.b64encode(bytes(signature)).decode()
    return json.dumps(envelope).encode()


def _replayed_older(hub: Hub) -> bytes:
    """A genuine envelope signed before the one installed (a lower serial)."""
    return hub.release("0.9", serials=ReleaseSerials(hub.root / "serials-of-the-past.json"))


def _equal_version(hub: Hub) -> bytes:
    return hub.release("1", deployment_id="tiny-1-again")


def _expired(hub: Hub) -> bytes:
    past = datetime.now(timezone.utc) - timedelta(days=3)
    return hub.release("2", now=past, expires_in=timedelta(days=1))


def _wrong_target(hub: Hub) -> bytes:
    return hub.release("2", targets=Targets(device_classes=("some-other-board",)))


def _malformed(hub: Hub) -> bytes:
    key = load_private_key(hub.keys / "release.key")
    return sign_envelope(b'{"type": "release", "format": 2, "model": 42}', [key])


def _traversal(hub: Hub) -> bytes:
    return hub.raw_release(hostile_archive([("model.toml", b"x"), ("../../escape", b"x")]))


def _symlink(hub: Hub) -> bytes:
    link = tarfile.TarInfo("labels.txt")
    link.type = tarfile.SYMTYPE
    link.linkname = "/etc/passwd"
    return hub.raw_release(hostile_archive([("model.toml", b"x"), link]))


ATTACKS = [
    (_tamper, "refused", "hash_mismatch"),
    (_truncate, "refused", "truncated"),
    (_wrong_key, "refused", "unknown_key"),
    (_bad_signature, "refused", "bad_signature"),
    (_replayed_older, "refused", "replay"),
    (_equal_version, "refused", "same_version"),
    (_expired, "refused", "expired"),
    (_wrong_target, "refused", "wrong_target"),
    (_malformed, "refused", "malformed"),
    (_traversal, "refused", "unsafe_archive"),
    (_symlink, "refused", "unsafe_archive"),
]


@pytest.mark.parametrize(
    ("attack", "result", "code"), ATTACKS, ids=lambda a: getattr(a, "__name__", a)
)
async def test_every_attack_is_refused_and_changes_nothing(
    hub, device, attack, result, code
) -> None:
    before = await _serving_v1(hub, device)
    outcome = await device.apply(attack(hub))
    assert (outcome["result"], outcome["code"]) == (result, code), outcome
    assert outcome["message"]
    assert device.store.snapshot() == before
    assert device.serving() == "1"
    assert list(device.store.staging.iterdir()) == []


async def test_an_oversized_artifact_is_refused_before_downloading(hub, tmp_path) -> None:
    with ThreadPoolExecutor(1) as executor:
        small = make_device(
            tmp_path / "small", hub.keys / "trust.json", executor, max_artifact_bytes=100
        )
        before = small.store.snapshot()
        outcome = await small.apply(hub.release("2"))
        assert (outcome["result"], outcome["code"]) == ("refused", "too_large")
        assert small.store.snapshot() == before
        assert not any(e["step"] == "downloading" for e in small.events)


async def test_below_threshold_is_refused(tmp_path) -> None:
    hub = Hub(tmp_path / "hub2")
    hub.artifacts.mkdir(parents=True)
    hub.keys.mkdir(parents=True)
    keygen(hub.keys, release_keys=2, release_threshold=2)
    runner, hub.url = await start_artifact_server(hub.artifacts)
    try:
        with ThreadPoolExecutor(1) as executor:
            dev = make_device(tmp_path / "dev", hub.keys / "trust.json", executor)
            try:
                envelope = hub.release("1", key_paths=[hub.keys / "release-1.key"])
                outcome = await dev.apply(envelope)
                assert (outcome["result"], outcome["code"]) == ("refused", "below_threshold")
                both = [hub.keys / "release-1.key", hub.keys / "release-2.key"]
                outcome = await dev.apply(hub.release("1", key_paths=both, deployment_id="d2"))
                assert outcome["result"] == "succeeded", outcome
            finally:
                await dev.registry.close()
    finally:
        await runner.cleanup()


async def test_a_model_that_fails_to_load_is_rolled_back_and_marked_bad(hub, device) -> None:
    before = await _serving_v1(hub, device)
    broken = break_model(hub.package("2"))
    outcome = await device.apply(hub.sign(broken))
    assert (outcome["result"], outcome["code"]) == ("failed", "load_failed"), outcome
    assert device.serving() == "1" and device.store.current("tiny") == "1"
    assert device.store.bad_versions("tiny") == {"2"}
    assert device.store.versions("tiny") == before["versions"]["tiny"]
    again = await device.apply(hub.sign(broken, deployment_id="tiny-2-retry"))
    assert again["code"] == "known_bad"


async def test_a_failed_golden_check_swaps_back_to_the_old_version(hub, device) -> None:
    await _serving_v1(hub, device)
    package = add_golden(hub.package("2", seed=2), rank=3)
    outcome = await device.apply(hub.sign(package))
    assert (outcome["result"], outcome["code"]) == ("failed", "health_check_failed"), outcome
    assert "golden" in outcome["message"]
    assert device.serving() == "1"
    assert device.store.floor("tiny") == "1" and device.store.bad_versions("tiny") == {"2"}


async def test_a_package_that_is_not_what_was_signed_is_refused(hub, device) -> None:
    await _serving_v1(hub, device)
    shared = (hub.artifacts / "tiny-1.tar.gz").read_bytes()
    variant = (hub.artifacts / "tiny-1.onnxruntime.fp32.tar.gz").read_bytes()
    outcome = await device.apply(hub.raw_release(shared, version="5", variant_bytes=variant))
    assert outcome["code"] == "bad_package" and "signed manifest says tiny 5" in outcome["message"]
    assert device.serving() == "1"


async def test_a_failed_release_swaps_back_to_a_seed_package_outside_the_store(
    hub, device, tmp_path
) -> None:
    seed = add_golden(hub.package("1", seed=1).rename(tmp_path / "seed-tiny"))
    await device.registry.activate(seed)  # what the daemon serves from its models directory
    assert device.store.current("tiny") is None
    outcome = await device.apply(hub.sign(add_golden(hub.package("2", seed=2), rank=3)))
    assert (outcome["result"], outcome["code"]) == ("failed", "health_check_failed")
    assert device.serving() == "1" and device.registry.get("tiny").package.root == seed.resolve()
    assert device.store.current("tiny") is None and device.store.versions("tiny") == []


@pytest.mark.parametrize(("top_k", "code"), [(1, "health_check_failed"), (2, "committed")])
async def test_golden_top_k_tolerates_a_reordered_near_tie(hub, tmp_path, top_k, code) -> None:
    """An int8 variant may swap the fp32 reference's top two classes; top_k=2 accepts that."""
    with ThreadPoolExecutor(1) as executor:
        device = make_device(tmp_path / "d", hub.keys / "trust.json", executor, golden_top_k=top_k)
        try:
            package = add_golden(hub.package("2", seed=2), rank=1)
            outcome = await device.apply(hub.sign(package))
        finally:
            await device.registry.close()
    assert outcome["code"] == code, outcome


async def test_https_artifacts_verify_the_server_with_the_configured_ca(hub, tmp_path) -> None:
    pki = make_pki(tmp_path / "pki")
    runner, hub.url = await start_artifact_server(
        hub.artifacts, tls=server_tls(pki.server_cert, pki.server_key)
    )
    try:
        with ThreadPoolExecutor(1) as executor:
            trusting = make_device(
                tmp_path / "ok", hub.keys / "trust.json", executor, ca_file=pki.ca
            )
            try:
                outcome = await trusting.apply(hub.release("1"))
                assert outcome["result"] == "succeeded", outcome
            finally:
                await trusting.registry.close()
            stranger = make_device(tmp_path / "no", hub.keys / "trust.json", executor)
            outcome = await stranger.apply(hub.release("1", deployment_id="again"))
            assert (outcome["result"], outcome["code"]) == ("refused", "download_failed")
            assert "certificate" in outcome["message"].lower()
    finally:
        await runner.cleanup()
