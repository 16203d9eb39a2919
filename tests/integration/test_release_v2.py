"""Release format 2 over a real Mosquitto, driven through the ``hub`` CLI: one retained release
topic per (group, model), the per-model serial as the floor (``hub rollback`` of a fleet, a
refused replay), and ``hub publish`` refusing what devices would refuse."""

from __future__ import annotations

import asyncio
import json
import random
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import aiomqtt
import pytest

from devtools.broker import Broker
from devtools.waiting import until
from edgeagent.fleet.topics import GroupTopics
from edgeagent.hardware.choose import release_variants
from edgeagent.hardware.service import Accelerators
from edgeagent.hardware.settings import HardwareSettings
from edgeagent.hub.keys import generate_key, rotate
from edgeagent.hub.publish import publish
from edgeagent.hub.sign import release_path
from edgeagent.models.package import INSTALLED_VARIANTS
from edgeagent.runtimes import get_runtime
from tests.integration.test_hub import hub as hub_cli
from tests.integration.test_updates_helpers import (
    Hub,
    Online,
    add_golden,
    device_fixture,  # noqa: F401 - fixture
    hostile_archive,
    hub_fixture,  # noqa: F401 - fixture
    make_device,
    stacks_fixture,  # noqa: F401 - fixture
)

pytestmark = pytest.mark.broker


def _sign(hub: Hub, version: str, name: str = "tiny", **options) -> Path:
    """``hub sign`` of a fresh package; returns the ``*.release.json`` it wrote."""
    hub.sign(add_golden(hub.package(version, seed=int(version), name=name)), **options)
    return release_path(hub.artifacts, name, version)


async def _publish(hub: Hub, broker: Broker, release: Path, *extra: str):
    return await asyncio.to_thread(
        hub_cli,
        "publish",
        str(release),
        "--group",
        "lab",
        "--trust",
        str(hub.keys / "trust.json"),
        "--broker",
        f"127.0.0.1:{broker.port}",
        "--json",
        *extra,
    )


async def _retained(broker: Broker, topic: str) -> bytes | None:
    """The retained message on ``topic`` (None if there is none): subscribe, then publish a
    non-retained marker on the same topic — whatever arrives before the marker was retained."""
    marker = b"marker-not-retained"
    async with aiomqtt.Client("127.0.0.1", broker.port) as client:
        await client.subscribe(topic, qos=1)
        await client.publish(topic, marker, qos=1)
        async for message in client.messages:
            payload = bytes(message.payload)  # type: ignore[arg-type]
            return None if payload == marker else payload
    return None


def _serving(online: Online, name: str = "tiny") -> str | None:
    try:
        return online.device.serving(name)
    except Exception:  # not loaded yet
        return None


async def test_two_models_released_to_one_group_reach_a_device_that_joins_afterwards(
    stacks, hub: Hub, broker: Broker
) -> None:
    for name in ("tiny", "other"):
        published = await _publish(hub, broker, _sign(hub, "1", name))
        assert published.returncode == 0, published.stderr
        assert json.loads(published.stdout)["topics"] == [f"edgeagent/group/lab/release/{name}"]

    late = await (await stacks("late")).start()
    await until(lambda: _serving(late, "tiny") == "1" and _serving(late, "other") == "1")
    assert late.device.store.models() == ["other", "tiny"]


async def test_hub_rollback_brings_three_devices_back_and_a_replay_is_refused(
    stacks, hub: Hub, broker: Broker
) -> None:
    fleet = [await (await stacks(f"dev-{n}")).start() for n in range(3)]
    assert (await _publish(hub, broker, _sign(hub, "1"))).returncode == 0
    await until(lambda: all(_serving(d) == "1" for d in fleet))
    v2 = _sign(hub, "2")
    v2_envelope = v2.read_bytes()
    assert (await _publish(hub, broker, v2)).returncode == 0
    await until(lambda: all(_serving(d) == "2" for d in fleet))

    rolled = await asyncio.to_thread(
        hub_cli,
        "rollback",
        "tiny",
        "--to",
        "1",
        "--group",
        "lab",
        "--release-key",
        str(hub.keys / "release.key"),
        "--artifacts",
        str(hub.artifacts),
        "--trust",
        str(hub.keys / "trust.json"),
        "--broker",
        f"127.0.0.1:{broker.port}",
        "--json",
    )
    assert rolled.returncode == 0, rolled.stderr
    result = json.loads(rolled.stdout)
    assert result["serial"] == 3 and result["topic"] == "edgeagent/group/lab/release/tiny"
    rollback = result["deployment_id"]
    await until(lambda: all((d.outcome() or {}).get("deployment_id") == rollback for d in fleet))
    for device in fleet:
        outcome = device.outcome()
        assert outcome is not None and (outcome["result"], outcome["code"]) == (
            "succeeded",
            "committed",
        )
        assert _serving(device) == "1" and device.device.store.serial_floor("tiny") == 3

    # An attacker on the broker replays the genuine v2 envelope into the retained slot: each
    # device says so in an event; its last outcome (the fleet table's) stays the rollback.
    await publish(broker.settings(), [GroupTopics("edgeagent", "lab").release("tiny")], v2_envelope)
    await until(lambda: all(d.device.events[-1].get("code") == "replay" for d in fleet))
    assert all(_serving(d) == "1" and d.device.store.current("tiny") == "1" for d in fleet)
    assert all((d.outcome() or {}).get("deployment_id") == rollback for d in fleet)


async def test_publish_refuses_an_unverifiable_release_and_unpublish_clears_the_slot(
    hub: Hub, broker: Broker
) -> None:
    topic = GroupTopics("edgeagent", "lab").release("tiny").name
    good = _sign(hub, "1")
    assert (await _publish(hub, broker, good)).returncode == 0

    stranger = generate_key(hub.root / "stranger", "release")
    unverifiable = _sign(hub, "2", key_paths=[stranger.key_path])
    refused = await _publish(hub, broker, unverifiable)
    assert refused.returncode == 2 and "devices would refuse this release" in refused.stderr
    assert "unknown_key" in refused.stderr
    assert await _retained(broker, topic) == good.read_bytes()  # the good one is still there

    cleared = await asyncio.to_thread(
        hub_cli, "unpublish", "tiny", "--group", "lab", "--broker", f"127.0.0.1:{broker.port}"
    )
    assert cleared.returncode == 0, cleared.stderr
    assert await _retained(broker, topic) is None


def _three_variant_package(hub: Hub, version: str) -> Path:
    """onnxruntime fp16 (what the generic x86 profile ranks first: CUDA, absent here),
    onnxruntime fp32 (its best CPU candidate with a variant) and OpenVINO fp32 (never needed
    by this profile: ranked below onnxruntime fp32 on the CPU)."""
    root = add_golden(hub.package(version, seed=int(version)))
    shutil.copy(root / "tiny.fp32.onnx", root / "tiny.fp16.onnx")
    (root / "tiny.xml").write_text("<net/>")
    (root / "tiny.bin").write_bytes(random.Random(7).randbytes(50_000))  # incompressible
    with (root / "model.toml").open("a") as toml:
        toml.write(
            '\n[[variant]]\nruntime = "onnxruntime"\nprecision = "fp16"\n'
            'files = ["tiny.fp16.onnx"]\n'
            '\n[[variant]]\nruntime = "openvino"\nprecision = "fp32"\n'
            'files = ["tiny.xml", "tiny.bin"]\n'
        )
    return root


async def test_a_first_release_fetches_only_the_variant_the_device_serves(
    hub: Hub, tmp_path: Path
) -> None:
    """The real hardware path on a device that never probed anything: profile generic-x86_64
    ranks onnxruntime/CUDA fp16 first, but this machine's onnxruntime lists no
    CUDAExecutionProvider, so its first release fetches neither that variant nor OpenVINO's
    (ranked below onnxruntime fp32 on the CPU): only onnxruntime fp32, which it then serves —
    the bytes downloaded are those of what it serves, 1.00x (fetching CUDA fp16 as a fallback's
    companion made it 2x here, 3x on a board whose first pick was an unlisted NPU)."""
    accelerators = Accelerators(HardwareSettings(profile="generic-x86_64"), tmp_path / "hw")
    assert "CUDAExecutionProvider" not in get_runtime("onnxruntime").devices()  # as here
    with ThreadPoolExecutor(2) as executor:
        device = make_device(
            tmp_path / "device", hub.keys / "trust.json", executor, opener=accelerators.open
        )
        try:
            outcome = await device.apply(hub.sign(_three_variant_package(hub, "2")))
            assert (outcome["result"], outcome["code"]) == ("succeeded", "committed"), outcome
            downloaded = next(e for e in device.events if e.get("step") == "downloaded")
            served = ["tiny-2.tar.gz", "tiny-2.onnxruntime.fp32.tar.gz"]
            expected = sum((hub.artifacts / name).stat().st_size for name in served)
            assert downloaded["variants"] == ["onnxruntime/fp32"]
            assert downloaded["bytes"] == expected  # 1.00x the bytes of what it serves

            installed = device.store.current_dir("tiny")
            assert installed is not None
            assert (installed / INSTALLED_VARIANTS).read_text().split() == ["onnxruntime/fp32"]
            assert not (installed / "tiny.fp16.onnx").exists()
            assert not (installed / "tiny.bin").exists()
            states = {
                c["candidate"]: c["state"]
                for c in accelerators.report()["models"]["tiny:2"]["candidates"]
            }
            assert states["onnxruntime:CPUExecutionProvider:fp32"] == "active"
        finally:
            await device.registry.close()


async def test_a_listed_accelerator_fetches_its_variant_and_the_cpu_fallback(
    hub: Hub, tmp_path: Path
) -> None:
    """Where onnxruntime does list CUDA (simulated: the device is told it is listed) the
    first release fetches the CUDA fp16 variant and the CPU fallback beside it, never the
    OpenVINO one; the CUDA probe then fails on this machine and the CPU variant serves."""
    accelerators = Accelerators(HardwareSettings(profile="generic-x86_64"), tmp_path / "hw")
    with ThreadPoolExecutor(2) as executor:
        device = make_device(
            tmp_path / "device", hub.keys / "trust.json", executor, opener=accelerators.open
        )
        device.updater.choose_variants = lambda available: release_variants(
            accelerators.profile, available, listed=lambda candidate: True
        )
        try:
            outcome = await device.apply(hub.sign(_three_variant_package(hub, "2")))
            assert (outcome["result"], outcome["code"]) == ("succeeded", "committed"), outcome
            downloaded = next(e for e in device.events if e.get("step") == "downloaded")
            assert downloaded["variants"] == ["onnxruntime/fp16", "onnxruntime/fp32"]
            states = {
                c["candidate"]: c["state"]
                for c in accelerators.report()["models"]["tiny:2"]["candidates"]
            }
            assert states["onnxruntime:CPUExecutionProvider:fp32"] == "active"
            assert states["onnxruntime:CUDAExecutionProvider:fp16"] == "unavailable"
        finally:
            await device.registry.close()


async def test_a_release_with_no_variant_this_device_runs_is_refused(hub: Hub, device) -> None:
    shared = hostile_archive([("model.toml", b"never downloaded")])
    before = device.store.snapshot()
    outcome = await device.apply(hub.raw_release(shared, variant_key=("litert", "fp16")))
    assert (outcome["result"], outcome["code"]) == ("refused", "no_variant"), outcome
    assert "litert/fp16" in outcome["message"] and device.store.snapshot() == before


async def test_a_variant_archive_that_would_replace_a_shared_file_is_refused(
    hub: Hub, device
) -> None:
    hub.sign(add_golden(hub.package("1")))
    shared = (hub.artifacts / "tiny-1.tar.gz").read_bytes()
    hostile = hostile_archive([("model.toml", b"name = 'evil'")])
    before = device.store.snapshot()
    outcome = await device.apply(hub.raw_release(shared, version="1", variant_bytes=hostile))
    assert (outcome["result"], outcome["code"]) == ("refused", "unsafe_archive"), outcome
    assert "would replace a file" in outcome["message"]
    assert device.store.snapshot() == before and list(device.store.staging.iterdir()) == []


async def test_a_release_in_another_models_slot_is_refused(hub: Hub, device) -> None:
    envelope = hub.sign(add_golden(hub.package("1")))
    slot = GroupTopics("edgeagent", "lab").release("other").name
    outcome = await device.updater.apply(envelope, slot)
    assert outcome is not None and (outcome["result"], outcome["code"]) == (
        "refused",
        "wrong_topic",
    )
    assert device.store.models() == []
    right = await device.updater.apply(
        envelope, GroupTopics("edgeagent", "lab").release("tiny").name
    )
    assert right is not None and right["result"] == "succeeded"


async def test_publish_verifies_against_the_trust_file_it_publishes(
    hub: Hub, broker: Broker
) -> None:
    """A release signed by a key only the rotated trust file lists: refused against the
    devices' current file, published together with the rotation."""
    new_key = generate_key(hub.keys, "release-2")
    rotated = rotate(
        hub.keys / "trust.json",
        old_root_keys=[hub.keys / "root.key"],
        release_pubs=[new_key.pub_path],
        out_path=hub.root / "trust-v2.json",
    )
    release = _sign(hub, "1", key_paths=[new_key.key_path])
    refused = await _publish(hub, broker, release)  # --trust: what devices have now
    assert refused.returncode == 2 and "unknown_key" in refused.stderr
    published = await _publish(hub, broker, release, "--trust-file", str(rotated))
    assert published.returncode == 0, published.stderr
    assert await _retained(broker, GroupTopics("edgeagent", "lab").trust.name) is not None
    slot = GroupTopics("edgeagent", "lab").release("tiny").name
    assert await _retained(broker, slot) == release.read_bytes()


async def test_two_downloaded_variants_may_share_a_file(hub: Hub, device) -> None:
    """fp16 (CUDA, first) and fp32 (the CPU fallback) both list the same ONNX file: the
    second archive's copy has the same bytes, so it is not a replacement. (The device is told
    its onnxruntime lists CUDA, or it would not fetch the fp16 variant at all.)"""
    choose = device.updater.choose_variants
    device.updater.choose_variants = lambda available: choose(available, listed=lambda c: True)
    root = add_golden(hub.package("1"))
    with (root / "model.toml").open("a") as toml:
        toml.write('\n[[variant]]\nruntime = "onnxruntime"\nprecision = "fp16"\n')
        toml.write('files = ["tiny.fp32.onnx"]\n')
    outcome = await device.apply(hub.sign(root))
    assert (outcome["result"], outcome["code"]) == ("succeeded", "committed"), outcome
    installed = device.store.current_dir("tiny")
    assert installed is not None
    assert (installed / INSTALLED_VARIANTS).read_text().split() == [
        "onnxruntime/fp16",
        "onnxruntime/fp32",
    ]
