"""The hub server signs what it sends: with the hub's release key each stage batch gets its own
envelope, targeted at exactly that batch's devices and verifiable with the fleet's trust file,
and every device's row records the envelope's SHA-256 and serial beside its answer. It signs
only what it verified as a device would (issue 23, finding 1): see test_hub_server_uploads."""

from __future__ import annotations

import hashlib
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from devtools.broker import Broker
from devtools.hub_fleet import MODEL, SIGNING_KEY, Api, fleet, hub_server, make_release
from edgeagent.fleet.manifest import MAX_TARGETS, parse_manifest
from edgeagent.fleet.signing import decode_envelope, sign_envelope
from edgeagent.fleet.trust import TrustStore
from edgeagent.hub.keys import keygen, load_private_key, trust_payload
from edgeagent.hub.policy import StagedPolicy
from edgeagent.hub.server import deploydb, deployreads, releasedb, targets
from edgeagent.hub.server.changes import Changes
from edgeagent.hub.server.controller import RolloutController
from edgeagent.hub.server.database import open_engine, upgrade
from edgeagent.hub.server.schema import devices
from edgeagent.hub.server.settings import ServerSettings

pytestmark = [pytest.mark.broker, pytest.mark.timeout(120)]


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def _deploy(engine: AsyncEngine, envelope: bytes, device_ids: list[str]) -> str:
    """The devices known to the hub and one deployment of ``envelope`` to all of them."""
    manifest = parse_manifest(decode_envelope(envelope, max_bytes=65536).payload)
    async with engine.begin() as connection:
        await connection.execute(
            devices.insert(),
            [
                {
                    "device_id": d,
                    "models": {},
                    "backends": {},
                    "temperatures": {},
                    "last_seen": time.time(),
                }
                for d in device_ids
            ],
        )
        release, _ = await releasedb.add_release(connection, envelope, manifest)
        return await deploydb.create_deployment(
            connection,
            release,
            targets.TargetSpec(device_ids=tuple(device_ids)),
            StagedPolicy(stages_pct=(100.0,)),
        )


def _trust_with_uploader(keys: Path) -> Path:
    """A trust file whose release role holds the hub's key and the one ``make_release`` signs
    the test uploads with (the server verifies uploads against it, then signs with its own)."""
    keygen(keys)
    root = load_private_key(keys / "root.key")
    payload = trust_payload(
        version=1,
        expires=datetime.now(timezone.utc) + timedelta(days=1),
        root=[root.public_key()],
        release=[load_private_key(keys / "release.key").public_key(), SIGNING_KEY.public_key()],
    )
    path = keys / "fleet-trust.json"
    path.write_bytes(sign_envelope(payload, [root]))
    return path


async def test_each_stage_batch_is_signed_for_its_devices_and_recorded(
    broker: Broker, tmp_path: Path
) -> None:
    trust_file = _trust_with_uploader(tmp_path / "keys")
    trust = TrustStore.load(trust_file)
    settings = broker.settings()
    async with (
        fleet(settings, 6) as devices,
        hub_server(
            f"sqlite:///{tmp_path / 'hub.db'}",
            settings,
            release_keys=(tmp_path / "keys" / "release.key",),
            trust_file=trust_file,
            send_batch=2,
        ) as url,
    ):
        api = Api(url)
        await api.synced()
        created = await api.deploy("2.0.0", stages_pct=[50, 100])
        done = await api.until(created["id"], "succeeded", "aborted")
        assert done["state"] == "succeeded", done

    rows = {row["device_id"]: row for row in done["devices"]}
    batches: dict[str, set[str]] = {}
    for device in devices:
        (envelope,) = set(device.envelopes)  # a pass that failed (broker busy) re-sends it
        manifest = parse_manifest(trust.verify(envelope, "release"))  # the hub's key signed it
        device_id = device.topics.device_id
        assert device_id in manifest.targets.device_ids
        batches.setdefault(_sha256(envelope), set()).add(device_id)
        row = rows[device_id]
        assert (row["envelope_sha256"], row["serial"]) == (_sha256(envelope), manifest.serial)
        assert (row["status"], row["code"]) == ("succeeded", "installed")
    # batches of at most two (send_batch) within each stage of three, none the uploaded bytes
    assert sorted(map(sorted, batches.values())) == [
        ["dev-000", "dev-001"],
        ["dev-002"],
        ["dev-003", "dev-004"],
        ["dev-005"],
    ]
    assert done["release"]["sha256"] not in batches


async def test_each_stage_is_signed_in_its_own_maintenance_window(
    broker: Broker, tmp_path: Path
) -> None:
    trust_file = _trust_with_uploader(tmp_path / "keys")
    trust = TrustStore.load(trust_file)
    settings = broker.settings()
    night = {"stage": 1, "schedule": "Mon-Sun 00:00-23:59"}
    weekend = {"stage": 2, "schedule": "Sat,Sun 01:00-05:00", "timezone": "Europe/Berlin"}
    async with (
        fleet(settings, 4) as devices,
        hub_server(
            f"sqlite:///{tmp_path / 'hub.db'}",
            settings,
            release_keys=(tmp_path / "keys" / "release.key",),
            trust_file=trust_file,
        ) as url,
    ):
        api = Api(url)
        await api.synced()
        await api.call("POST", "/api/v1/releases", expect=201, data=make_release("2.0.0"))
        request = {"model": MODEL, "version": "2.0.0", "group": "lab", "stages_pct": [50, 100]}
        refused = [  # each a clear 422, nothing created
            ({**night, "stage": 3}, "this deployment has stages 1-2"),
            ({**night, "schedule": "Funday 02:00-04:00"}, "stage 1: days 'Funday'"),
            ({**night, "timezone": "Mars/Olympus"}, "stage 1: time zone"),
        ]
        for entry, words in refused:
            answer = await api.call(
                "POST",
                "/api/v1/deployments",
                expect=422,
                json={**request, "stage_windows": [entry]},
            )
            assert words in answer["error"], answer
        twice = {**request, "stage_windows": [night, night]}
        answer = await api.call("POST", "/api/v1/deployments", expect=422, json=twice)
        assert "stage 1 has two windows" in answer["error"]
        created = await api.call(
            "POST",
            "/api/v1/deployments",
            expect=201,
            json={**request, "stage_windows": [night, weekend]},
        )
        done = await api.until(created["id"], "succeeded", "aborted")
        assert done["state"] == "succeeded", done
    stage_of = {row["device_id"]: row["stage"] for row in done["devices"]}
    for device in devices:
        (envelope,) = set(device.envelopes)
        window = parse_manifest(trust.verify(envelope, "release")).window
        assert window is not None
        expected = night if stage_of[device.topics.device_id] == 1 else weekend
        assert window.to_dict() == {k: v for k, v in expected.items() if k != "stage"}


async def test_without_a_release_key_the_uploaded_envelope_is_sent_and_recorded(
    broker: Broker, tmp_path: Path
) -> None:
    settings = broker.settings()
    async with (
        fleet(settings, 2) as devices,
        hub_server(f"sqlite:///{tmp_path / 'hub.db'}", settings) as url,
    ):
        api = Api(url)
        await api.synced()
        done = await api.until((await api.deploy("2.0.0"))["id"], "succeeded", "aborted")
    uploaded = done["release"]["sha256"]
    assert {_sha256(e) for d in devices for e in d.envelopes} == {uploaded}
    assert {row["envelope_sha256"] for row in done["devices"]} == {uploaded}


def test_a_signed_batch_must_fit_in_one_manifest() -> None:
    settings = ServerSettings(
        release_keys=(Path("release.key"),),
        trust_file=Path("trust.json"),
        send_batch=MAX_TARGETS + 1,
    )
    with pytest.raises(ValueError, match="--send-batch must be at most"):
        settings.validate()


async def test_an_answer_before_the_batch_is_marked_sent_keeps_what_was_sent(
    tmp_path: Path,
) -> None:
    """A device may answer while the controller is still publishing its batch (the answer
    moves it out of "queued" first): the envelope record must not depend on that race."""
    engine = open_engine(f"sqlite:///{tmp_path / 'hub.db'}")
    await upgrade(engine)
    envelope = make_release("2.0.0")
    manifest = parse_manifest(decode_envelope(envelope, max_bytes=65536).payload)
    device_ids = [f"dev-{i}" for i in range(3)]

    async def publish_and_answer_at_once(topic: str, payload: bytes) -> None:
        device_id = topic.split("/")[2]  # <prefix>/device/<id>/release
        async with engine.begin() as connection:
            await deploydb.record_outcome(
                connection,
                device_id,
                manifest.deployment_id,
                outcome="succeeded",
                result="succeeded",
                code="installed",
                message="",
                now=time.time(),
            )

    try:
        deployment_id = await _deploy(engine, envelope, device_ids)
        controller = RolloutController(engine, publish_and_answer_at_once, "edgeagent", Changes())
        await controller.run_once()
        async with engine.connect() as connection:
            done = await deployreads.get_deployment(connection, deployment_id)
    finally:
        await engine.dispose()
    assert done is not None and done["state"] == "succeeded"
    assert [(d["status"], d["envelope_sha256"], d["serial"]) for d in done["devices"]] == [
        ("succeeded", _sha256(envelope), manifest.serial)
    ] * 3


async def test_the_controller_parses_a_release_once_per_deployment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three batches of one deployment read the stored release once, not once per batch."""
    from edgeagent.hub.server import batches as batches_module

    parsed: list[bytes] = []
    real = batches_module.release_manifest

    def counting(envelope: bytes):  # type: ignore[no-untyped-def]
        parsed.append(envelope)
        return real(envelope)

    monkeypatch.setattr(batches_module, "release_manifest", counting)
    engine = open_engine(f"sqlite:///{tmp_path / 'hub.db'}")
    await upgrade(engine)
    envelope = make_release("2.0.0")
    device_ids = [f"dev-{i}" for i in range(3)]
    published: list[str] = []

    async def publish(topic: str, payload: bytes) -> None:
        published.append(topic)

    try:
        deployment_id = await _deploy(engine, envelope, device_ids)
        controller = RolloutController(engine, publish, "edgeagent", Changes(), send_batch=1)
        await controller.run_once()
        async with engine.connect() as connection:
            done = await deployreads.get_deployment(connection, deployment_id)
    finally:
        await engine.dispose()
    assert done is not None
    assert [d["status"] for d in done["devices"]] == ["sent"] * 3
    assert len(published) == 3
    assert parsed == [envelope]
