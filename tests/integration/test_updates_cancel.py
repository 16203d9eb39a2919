"""The device side of an abort: a release covered by a cancellation the hub signed is never
installed — when the cancellation came first (an offline device's session delivers release
then cancellation, and the worker may reach the release after both), when it came while the
artifacts downloaded, and after a restart in between. A forged, expired or narrower
cancellation stops nothing. A release a group's retained slot still holds, which this device
is past, is ignored quietly there and still answered on the device's own topic."""

from __future__ import annotations

import dataclasses
import json
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edgeagent.fleet.cancel import Cancellation, parse_cancellation
from edgeagent.fleet.manifest import ManifestError, ReleaseManifest, parse_manifest
from edgeagent.fleet.signing import decode_envelope, sign_envelope
from edgeagent.fleet.topics import DeviceTopics, GroupTopics
from edgeagent.hub.release_checks import read_manifest
from tests.integration.test_updates_helpers import (
    Device,
    Hub,
    device_fixture,  # noqa: F401 - fixture
    hub_fixture,  # noqa: F401 - fixture
    make_device,
)

DEVICE_TOPIC = DeviceTopics("edgeagent", "dev-1").release.name
SLOT = GroupTopics("edgeagent", "lab").release("tiny").name


def manifest_of(envelope: bytes) -> ReleaseManifest:
    manifest = read_manifest(envelope)
    assert isinstance(manifest, ReleaseManifest)
    return manifest


def cancellation_of(release: ReleaseManifest, **changes: Any) -> Cancellation:
    now = datetime.now(timezone.utc).replace(microsecond=0)
    fields = {
        "model": release.model,
        "deployment_id": release.deployment_id,
        "serial": release.serial,
        "issued_at": now,
        "expires": release.expires,
        "reason": "aborted by an operator",
        **changes,
    }
    return Cancellation(**fields)


async def serving_v1(hub: Hub, device: Device) -> None:
    assert (await device.apply(hub.release("1")))["result"] == "succeeded"


async def test_a_release_whose_deployment_was_cancelled_is_refused_and_nothing_changes(
    hub: Hub, device: Device
) -> None:
    await serving_v1(hub, device)
    envelope = hub.release("2")
    release = manifest_of(envelope)
    await device.updater.on_message(
        DEVICE_TOPIC, hub.signer().cancellation(cancellation_of(release))
    )
    before = device.store.snapshot()

    outcome = await device.updater.apply(envelope, DEVICE_TOPIC)

    assert outcome is not None
    assert (outcome["result"], outcome["code"]) == ("refused", "cancelled"), outcome
    assert outcome["deployment_id"] == release.deployment_id
    assert "aborted by an operator" in outcome["message"]
    assert device.events[-1]["code"] == "cancelled"
    assert device.store.snapshot() == before and device.serving() == "1"
    assert device.updater.status()["cancellations"][0]["deployment_id"] == release.deployment_id


async def test_a_cancellation_arriving_during_the_download_stops_the_install(
    hub: Hub, device: Device
) -> None:
    """The worker verified the release before the cancellation arrived; the check before
    unpacking refuses it: nothing installed, the downloads discarded, reported ``refused``."""
    await serving_v1(hub, device)
    envelope = hub.release("2")
    cancel = hub.signer().cancellation(cancellation_of(manifest_of(envelope)))
    download = device.updater.installer.download

    async def download_then_cancel(artifact: Any, release: dict[str, str]) -> Path:
        path = await download(artifact, release)
        await device.updater.on_message(DEVICE_TOPIC, cancel)  # as the link would hand it over
        return path

    device.updater.installer.download = download_then_cancel  # type: ignore[method-assign]
    outcome = await device.apply(envelope)

    assert (outcome["result"], outcome["code"]) == ("refused", "cancelled"), outcome
    steps = [e["step"] for e in device.events if e.get("version") == "2"]
    assert "verified" in steps and "installed" not in steps, steps
    assert device.store.versions("tiny") == ["1"] and device.serving() == "1"
    assert device.store.pending() is None
    assert not list(device.store.staging.iterdir())


async def test_a_held_cancellation_survives_a_restart(hub: Hub, tmp_path: Path) -> None:
    envelope = hub.release("2")
    cancel = hub.signer().cancellation(cancellation_of(manifest_of(envelope)))
    with ThreadPoolExecutor(2) as executor:
        first = make_device(tmp_path / "device", hub.keys / "trust.json", executor)
        await first.updater.on_message(DEVICE_TOPIC, cancel)
        await first.registry.close()
        again = make_device(tmp_path / "device", hub.keys / "trust.json", executor)
        try:
            outcome = await again.apply(envelope)
        finally:
            await again.registry.close()
    assert (outcome["result"], outcome["code"]) == ("refused", "cancelled"), outcome


async def test_what_a_cancellation_does_not_cover_installs(hub: Hub, device: Device) -> None:
    """Forged (a key the trust file lacks), expired, of another deployment, or below the
    release's serial (a later deployment of the same release): none of them stops it."""
    (hub.keys / "serials.json").write_text('{"tiny": 9}')  # a hub that has released before
    envelope = hub.release("2")
    release = manifest_of(envelope)
    past = release.issued_at - timedelta(days=2)
    stranger = Ed25519PrivateKey.generate()
    sign = hub.signer().cancellation
    for cancel in (
        sign_envelope(cancellation_of(release).to_payload(), [stranger]),
        sign(cancellation_of(release, issued_at=past, expires=past + timedelta(days=1))),
        sign(cancellation_of(release, deployment_id="another-deployment")),
        sign(cancellation_of(release, serial=release.serial - 1)),
    ):
        await device.updater.on_message(DEVICE_TOPIC, cancel)
    held = {(c["deployment_id"], c["serial"]) for c in device.updater.status()["cancellations"]}
    assert held == {
        ("another-deployment", release.serial),
        (release.deployment_id, release.serial - 1),
    }
    outcome = await device.apply(envelope)
    assert (outcome["result"], outcome["code"]) == ("succeeded", "committed"), outcome


def test_a_cancellation_is_no_release_and_a_release_no_cancellation(hub: Hub) -> None:
    """Both are signed by the release role: the payload's type keeps them apart."""
    envelope = hub.release("2")
    cancel = hub.signer().cancellation(cancellation_of(manifest_of(envelope)))
    with pytest.raises(ManifestError) as refused:
        parse_manifest(decode_envelope(cancel, max_bytes=65536).payload)
    assert refused.value.code == "malformed"
    with pytest.raises(ManifestError, match="type 'cancel'"):
        parse_cancellation(decode_envelope(envelope, max_bytes=65536).payload)


async def test_a_slot_behind_the_device_is_answered_by_an_event_only(
    hub: Hub, device: Device
) -> None:
    """The group's slot still holds v1 (``hub publish``); the hub server then updated this
    device to v2 on its own topic. Every reconnect delivers the slot again: it is answered as
    the committed envelope there is (``same_version``), by an event only — the saved history,
    the state report's last outcome and the store stay as they were. The same envelope on the
    device's own topic is a replay sent to it, refused and kept in its history."""
    old = hub.release("1")
    assert (await device.updater.apply(old, SLOT))["result"] == "succeeded"  # type: ignore[index]
    committed = hub.release("2")
    last = await device.apply(committed)
    assert last["result"] == "succeeded"
    history = device.updater.status()["history"]
    snapshot = device.store.snapshot()

    for envelope, code in ((old, "replay"), (committed, "same_version")):
        answer = await device.updater.apply(envelope, SLOT)
        assert answer is not None and (answer["result"], answer["code"]) == ("refused", code)
        assert device.events[-1]["code"] == code
        assert device.updater.reporter.last == last
    assert "hub unpublish" in device.events[-2]["message"]
    assert device.updater.status()["history"] == history
    assert device.store.snapshot() == snapshot

    answer = await device.updater.apply(old, DEVICE_TOPIC)
    assert answer is not None and (answer["result"], answer["code"]) == ("refused", "replay")
    assert device.updater.reporter.last == answer  # sent to this device: kept


def test_a_cancellation_round_trips(hub: Hub) -> None:
    now = datetime.now(timezone.utc).replace(microsecond=0)
    original = Cancellation("tiny", "dep-1", 7, now, now + timedelta(days=1), "why")
    payload = decode_envelope(hub.signer().cancellation(original), max_bytes=65536).payload
    assert parse_cancellation(payload) == original
    long = dataclasses.replace(original, reason="x" * 500).to_payload()
    assert json.loads(long)["reason"] == "x" * 200  # the parser's limit, so it always signs
