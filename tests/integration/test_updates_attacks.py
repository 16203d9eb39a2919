"""Attacks on the updater through its public entry points (the MQTT handler and ``apply``),
with real keys, a real artifact server on loopback and hand-made envelopes (issue 10).

Each test checks the refusal code *and* that nothing changed that should not have, and then
that a genuine release or rotation still goes through afterwards (nothing wedged or blocked).
"""

from __future__ import annotations

import hashlib
import json
import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from edgeagent.fleet.manifest import (
    MAX_SERIAL,
    Artifact,
    ReleaseManifest,
    Targets,
    VariantArtifact,
)
from edgeagent.fleet.signing import decode_envelope, sign_envelope
from edgeagent.fleet.topics import DeviceTopics, GroupTopics
from edgeagent.fleet.trust import TrustStore, trust_state_path
from edgeagent.hub.keys import generate_key, load_private_key, rotate
from edgeagent.hub.serials import ReleaseSerials
from edgeagent.updates.settings import UpdateSettings
from tests.integration.test_updates_helpers import (
    Device,
    Hub,
    add_golden,
    device_fixture,  # noqa: F401 - fixture
    hub_fixture,  # noqa: F401 - fixture
)

TRUST_TOPIC = GroupTopics("edgeagent", "default").trust.name
RELEASE_TOPIC = GroupTopics("edgeagent", "default").release("tiny").name


def _rotated_v2(hub: Hub, release_key_name: str = "release-2") -> tuple[bytes, Path]:
    """Trust v2 that replaces (revokes) the hub's release key; returns it and the new key."""
    new_key = generate_key(hub.keys, release_key_name)
    v2 = rotate(
        hub.keys / "trust.json",
        old_root_keys=[hub.keys / "root.key"],
        release_pubs=[new_key.pub_path],
        out_path=hub.root / "trust-v2.json",
    )
    return v2.read_bytes(), new_key.key_path


def _last_event(device: Device) -> dict:
    return [e for e in device.events if e.get("step") == "done"][-1]


def _chain(*envelopes: bytes) -> bytes:
    return json.dumps([json.loads(e) for e in envelopes]).encode()


async def test_a_chain_with_a_forged_link_changes_nothing(hub: Hub, device: Device) -> None:
    """Item 1: the good v2 before a forged v3 must not be half-applied (it was written to
    disk while memory kept v1, so the revoked key stayed trusted and the genuine rotation was
    then refused as stale_store)."""
    v2, new_key = _rotated_v2(hub)
    document = json.loads(decode_envelope(v2, max_bytes=1 << 16).payload)
    document["version"] = 3
    attacker = generate_key(hub.root, "attacker")
    forged_v3 = sign_envelope(json.dumps(document).encode(), [load_private_key(attacker.key_path)])
    trust_file = trust_state_path(device.state_dir)
    before = trust_file.read_bytes()

    await device.updater.on_message(TRUST_TOPIC, _chain(v2, forged_v3))
    assert (_last_event(device)["result"], _last_event(device)["code"]) == (
        "refused",
        "unknown_key",
    )
    assert trust_file.read_bytes() == before and device.updater.trust.version == 1

    await device.updater.on_message(TRUST_TOPIC, v2)  # the hub's genuine rotation still applies
    assert _last_event(device)["code"] == "rotated"
    assert TrustStore.load(trust_file).version == device.updater.trust.version == 2
    refused = await device.apply(hub.release("1"))  # signed with the revoked key
    assert (refused["result"], refused["code"]) == ("refused", "unknown_key")
    accepted = await device.apply(hub.release("1", key_paths=[new_key], deployment_id="new"))
    assert accepted["result"] == "succeeded", accepted


async def test_a_release_copied_onto_the_trust_topic_does_not_block_it(hub, device) -> None:
    """Item 2: the copy is refused on the trust topic; the same bytes still install."""
    envelope = hub.release("1")
    await device.updater.on_message(TRUST_TOPIC, envelope)
    assert _last_event(device)["result"] == "refused"
    outcome = await device.apply(envelope)
    assert outcome["result"] == "succeeded", outcome
    assert device.serving() == "1"


async def test_a_refusal_never_suppresses_a_later_delivery_of_the_same_bytes(hub, device) -> None:
    """Item 2: only accepted envelopes are remembered. A release signed by a key the device
    learns only later is refused now and installs when it is delivered again."""
    v2, new_key = _rotated_v2(hub)
    envelope = hub.release("1", key_paths=[new_key])
    first = await device.apply(envelope)
    assert (first["result"], first["code"]) == ("refused", "unknown_key")
    await device.updater.on_message(TRUST_TOPIC, v2)
    again = await device.apply(envelope)
    assert again["result"] == "succeeded", again


async def test_the_hint_queue_keeps_the_newest_per_topic(hub, device) -> None:
    """Item 12: junk flooding one topic never pushes a genuine release on another out."""
    device_topic = DeviceTopics("edgeagent", device.updater.device.device_id).release.name
    await device.updater.on_message(device_topic, hub.release("1"))
    for number in range(40):
        await device.updater.on_message(RELEASE_TOPIC, b"junk %d" % number)
    assert device.updater.status()["queued"] == 2  # one per topic, the newest of each
    report_file = device.store.root / "report.json"
    assert not report_file.exists()


async def test_junk_costs_no_disk_writes(hub, device) -> None:
    """Item 12: bytes no trusted key signed are refused without persisting anything."""
    await device.apply(hub.release("1"))
    before = device.store.snapshot(), (device.store.root / "handled.json").read_bytes()
    for junk in (b"junk", b"{}", b'{"payload": "", "signatures": []}'):
        outcome = await device.apply(junk)
        assert (outcome["result"], outcome["code"]) == ("refused", "malformed")
    assert (device.store.snapshot(), (device.store.root / "handled.json").read_bytes()) == before
    assert device.updater.reporter.last["result"] == "succeeded"  # junk is not the last outcome


async def test_an_envelope_over_the_configured_size_is_refused(hub, tmp_path) -> None:
    """Part 1: the updater enforces [updates] max_manifest_bytes itself."""
    from concurrent.futures import ThreadPoolExecutor

    from tests.integration.test_updates_helpers import make_device

    envelope = hub.release("1")
    with ThreadPoolExecutor(1) as executor:
        small = make_device(
            tmp_path / "small", hub.keys / "trust.json", executor, max_manifest_bytes=100
        )
        try:
            outcome = await small.apply(envelope)
            assert (outcome["result"], outcome["code"]) == ("refused", "too_large")
            assert "[updates] max_manifest_bytes" in outcome["message"]
            assert small.store.snapshot()["current"] == {}
        finally:
            await small.registry.close()
    assert UpdateSettings().max_manifest_bytes > len(envelope)


async def test_a_garbage_golden_file_rolls_back_and_reports_the_step(hub, device) -> None:
    """Item 3: np.load on random bytes used to escape the guards; the model that never
    passed its health check kept serving and pending.json wedged every later install. A
    signed release whose golden file is unreadable is broken as published: it fails its
    health check (and is marked bad, so a re-delivery does not try it again)."""
    assert (await device.apply(hub.release("1")))["result"] == "succeeded"
    package = add_golden(hub.package("2", seed=2))
    (package / "golden.npz").write_bytes(os.urandom(4096))
    outcome = await device.apply(hub.sign(package))
    assert (outcome["result"], outcome["code"]) == ("failed", "health_check_failed"), outcome
    assert "golden.npz cannot be read" in outcome["message"]
    assert "2" in device.store.bad_versions("tiny")
    assert device.serving() == "1" and device.store.current("tiny") == "1"
    assert device.store.pending() is None
    assert (await device.apply(hub.release("3")))["result"] == "succeeded"


@pytest.mark.parametrize(
    ("blocker", "result", "step"),
    [("tiny", "refused", "begin"), ("tiny/1", "failed", "activate")],
)
async def test_an_unexpected_failure_rolls_back_and_unwedges(
    hub, device, blocker: str, result: str, step: str
) -> None:
    """Item 3: an exception nobody planned for (a file where the store expects a directory)
    is reported as internal_error naming the step, and the next install is not blocked."""
    path = device.store.root / blocker
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(b"not a directory")
    outcome = await device.apply(hub.release("1"))
    assert (outcome["result"], outcome["code"]) == (result, "internal_error"), outcome
    assert f"'{step}'" in outcome["message"]
    assert device.store.pending() is None
    path.unlink()
    again = await device.apply(hub.release("1", deployment_id="tiny-1-again"))
    assert again["result"] == "succeeded", again


def _raw_manifest(hub: Hub, version: str) -> bytes:
    now = datetime.now(timezone.utc).replace(microsecond=0)
    body = b"irrelevant"
    manifest = ReleaseManifest(
        model="tiny",
        version=version,
        serial=hub.next_serial(),
        artifact=Artifact(f"{hub.url}/x.tar.gz", len(body), hashlib.sha256(body).hexdigest()),
        variants=(
            VariantArtifact(
                "onnxruntime",
                "fp32",
                Artifact(f"{hub.url}/y.tar.gz", len(body), hashlib.sha256(body).hexdigest()),
            ),
        ),
        issued_at=now,
        expires=now + timedelta(days=1),
        deployment_id="long",
        targets=Targets(),
    )
    return sign_envelope(manifest.to_payload(), [load_private_key(hub.keys / "release.key")])


async def test_a_256_character_version_is_malformed(hub, device) -> None:
    """Item 3/4: it used to reach the store and fail there with ENAMETOOLONG."""
    before = device.store.snapshot()
    outcome = await device.apply(_raw_manifest(hub, "1" * 256))
    assert (outcome["result"], outcome["code"]) == ("refused", "malformed")
    assert device.store.snapshot() == before
    assert (await device.apply(hub.release("1")))["result"] == "succeeded"


async def test_no_downgrade_below_the_factory_seed(hub, device, tmp_path) -> None:
    """Item 5: a device serving seed v5 refuses a genuine, unexpired v2 as rollback."""
    seed = add_golden(hub.package("5", seed=5).rename(tmp_path / "seed-tiny"))
    await device.registry.activate(seed)
    before = device.store.snapshot()
    outcome = await device.apply(hub.release("2"))
    assert (outcome["result"], outcome["code"]) == ("refused", "rollback"), outcome
    assert device.serving() == "5" and device.store.snapshot() == before
    assert (await device.apply(hub.release("6")))["result"] == "succeeded"


async def test_a_root_signed_floor_reset_recovers_from_a_leaked_release_key(hub, device) -> None:
    """Item 6: a leaked release key signed the highest possible serial; every genuine release
    was a `replay` for ever. The root keys revoke the key and reset the floor in one rotation;
    the next genuine release installs, the attacker's key is refused."""
    assert (await device.apply(hub.release("1")))["result"] == "succeeded"
    attacker = hub.root / "attacker-serials.json"
    attacker.write_text(json.dumps({"tiny": MAX_SERIAL - 1}))
    leaked = await device.apply(hub.release("999999999", serials=ReleaseSerials(attacker)))
    assert leaked["result"] == "succeeded" and device.serving() == "999999999"
    blocked = await device.apply(hub.release("2"))
    assert (blocked["result"], blocked["code"]) == ("refused", "replay")

    new_key = generate_key(hub.keys, "release-2")
    rotated = rotate(
        hub.keys / "trust.json",
        old_root_keys=[hub.keys / "root.key"],
        release_pubs=[new_key.pub_path],
        floor_resets={"tiny": "1"},
    )
    await device.updater.on_message(TRUST_TOPIC, rotated.read_bytes())
    assert _last_event(device)["code"] == "rotated"
    assert "floor of tiny reset to 1" in _last_event(device)["message"]
    assert (device.store.floor("tiny"), device.store.serial_floor("tiny")) == ("1", None)

    again = await device.apply(hub.release("999999999", deployment_id="attacker-again"))
    assert (again["result"], again["code"]) == ("refused", "unknown_key")
    fixed = await device.apply(hub.release("2", key_paths=[new_key.key_path]))
    assert fixed["result"] == "succeeded", fixed
    assert device.serving() == "2" and device.store.floor("tiny") == "2"
    assert device.store.current("tiny") == "2"


class UnloadingRegistry:
    """The real registry, except that the new model is unloaded (as an operator's unload
    request would) while its health check runs."""

    def __init__(self, registry) -> None:
        self.registry = registry

    async def activate(self, package_dir: Path):
        served = await self.registry.activate(package_dir)
        registry = self.registry

        class Unloaded:
            package = served.package

            async def infer(self, feeds, **options):
                await registry.unload(served.package.name)
                return await served.infer(feeds, **options)

        return Unloaded() if served.package.version == "2" else served

    async def unload(self, name: str) -> None:
        await self.registry.unload(name)

    def get(self, name: str):
        return self.registry.get(name)


async def test_an_unload_during_the_health_check_never_marks_the_release_bad(hub, device):
    """Item 9 (updater side): the check proves nothing about the release then; it rolls back
    without `known_bad`, and the re-delivery installs."""
    assert (await device.apply(hub.release("1")))["result"] == "succeeded"
    device.updater.registry = UnloadingRegistry(device.registry)
    envelope = hub.release("2")
    outcome = await device.apply(envelope)
    assert (outcome["result"], outcome["code"]) == ("failed", "health_check_interrupted"), outcome
    assert device.store.bad_versions("tiny") == set() and device.store.pending() is None
    device.updater.registry = device.registry
    again = await device.apply(envelope)
    assert again["result"] == "succeeded", again
