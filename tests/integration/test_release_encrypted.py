"""Encrypted releases through the whole product: a real daemon and real Mosquitto, the hub CLI.

The device creates its key pair at first start and reports the public key; ``hub status
--recipients`` collects it, ``hub sign --encrypt`` seals the release for it, and the device
serves the new version from memory — no file under its state directory holds the plaintext
model, before or after a restart. A device whose key the release was not wrapped for refuses
it (``not_a_recipient``) with its store unchanged; a wrap for another key fails to load and
rolls back.
"""

from __future__ import annotations

import asyncio
import functools
import json
import stat
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from devtools.broker import Broker
from devtools.waiting import until
from edgeagent.fleet.topics import GroupTopics
from edgeagent.hub.publish import publish
from edgeagent.models.device_key import DEVICE_KEY_FILE, open_device_key
from edgeagent.models.seal_crypto import public_key_text
from edgeagent.models.session import open_variant
from edgeagent.models.unsealer import Unsealer
from tests.integration.test_hub import hub as hub_cli
from tests.integration.test_updates_e2e import Agent, cli
from tests.integration.test_updates_helpers import (
    Device,
    Hub,
    Online,
    add_golden,
    hub_fixture,  # noqa: F401 - fixture
    make_device,
)

pytestmark = pytest.mark.broker


def _files_holding(root: Path, needle: bytes) -> list[Path]:
    """Every regular file below ``root`` whose bytes contain ``needle``."""
    return [p for p in root.rglob("*") if p.is_file() and needle in p.read_bytes()]


def _plaintext_marks(package: Path) -> list[bytes]:
    """Slices of the package's model file that any plaintext copy on disk would contain."""
    data = next(package.glob("*.onnx")).read_bytes()
    return [data[i : i + 48] for i in (0, len(data) // 2, len(data) - 48)]


async def _sign_encrypted(hub: Hub, package: Path, recipients: Path) -> Path:
    signed = await asyncio.to_thread(
        hub_cli, *hub.sign_command(package, "--encrypt", "--recipients", str(recipients))
    )
    assert signed.returncode == 0, signed.stderr
    return Path(json.loads(signed.stdout)["release"])


@pytest.fixture
async def agent(tmp_path: Path, broker: Broker, hub: Hub) -> AsyncIterator[Agent]:
    instance = Agent(tmp_path / "device", broker, hub)
    yield instance
    await instance.stop()


async def test_an_encrypted_release_is_served_from_memory_and_never_lands_in_plaintext(
    agent: Agent, hub: Hub, broker: Broker, tmp_path: Path
) -> None:
    await agent.start()
    key_file = agent.state / DEVICE_KEY_FILE
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    public = (await agent.get("/v1/status"))["device_key"]["public_key"]
    assert public == public_key_text(open_device_key(agent.state).private.public_key())

    recipients = tmp_path / "recipients.toml"
    collected = await asyncio.to_thread(
        cli, "status", "--broker", f"127.0.0.1:{broker.port}", "--recipients", str(recipients)
    )
    assert collected.returncode == 0, collected.stderr
    assert f'"dev-e2e" = "{public}"' in recipients.read_text()

    package = add_golden(hub.package("2", seed=2))
    release = await _sign_encrypted(hub, package, recipients)
    marks = _plaintext_marks(package)
    sealed = next(hub.artifacts.glob("tiny-2.*.sealed.tar.gz"))
    assert not any(_files_holding(hub.artifacts, mark) for mark in marks)  # nor on the server
    published = await asyncio.to_thread(cli, *hub.publish_command(release, broker.port))
    assert published.returncode == 0, published.stderr
    await agent.wait_version("2")

    async def committed() -> bool:  # it serves before its health check and commit finish
        last = (await agent.get("/v1/status"))["updates"]["last"]
        return last is not None and last["code"] == "committed"

    await until(committed, 60, what="the release committed")
    stored = agent.state / "store" / "tiny" / "2"
    assert (stored / "sealed" / "onnxruntime.fp32" / "tiny.fp32.onnx").is_file()
    assert sealed.stat().st_size > 0
    for mark in marks:
        assert _files_holding(agent.state, mark) == []

    await agent.stop()  # a restart decrypts again at load, with the same key pair
    await agent.start()
    assert await agent.version() == "2"
    assert (await agent.get("/v1/status"))["device_key"]["public_key"] == public
    for mark in marks:
        assert _files_holding(agent.state, mark) == []


@pytest.fixture
async def sealed_devices(tmp_path: Path, hub: Hub, broker: Broker) -> AsyncIterator:
    """Online device stacks that open sealed variants with their own key pair."""
    made: list[Online] = []
    with ThreadPoolExecutor(2) as executor:

        async def make(device_id: str) -> tuple[Online, str]:
            state = tmp_path / device_id
            key = open_device_key(state)
            opener = functools.partial(open_variant, unsealer=Unsealer(lambda: key.private))
            device = make_device(state, hub.keys / "trust.json", executor, opener=opener)
            online = Online(device, broker, device_id)
            made.append(online)
            return await online.start(), key.public_text

        yield make
        for online in made:
            await online.stop()
            await online.device.registry.close()


def _untouched(device: Device) -> bool:
    """Nothing of the release is in the store or its staging area."""
    staged = [p for p in device.store.staging.rglob("*") if p.is_file()]
    return device.store.models() == [] and staged == []


async def test_a_device_the_release_is_not_wrapped_for_refuses_it_before_downloading(
    sealed_devices, hub: Hub, broker: Broker, tmp_path: Path
) -> None:
    member, member_key = await sealed_devices("dev-1")
    outsider, _ = await sealed_devices("dev-2")
    recipients = tmp_path / "recipients.json"
    recipients.write_text(json.dumps({"dev-1": member_key}))
    release = await _sign_encrypted(hub, add_golden(hub.package("1", seed=1)), recipients)
    await publish(
        broker.settings(), [GroupTopics("edgeagent", "lab").release("tiny")], release.read_bytes()
    )

    await until(lambda: member.outcome() is not None and outsider.outcome() is not None)
    assert member.outcome()["code"] == "committed" and member.device.serving() == "1"  # type: ignore[index]
    refused = outsider.outcome()
    assert refused is not None and (refused["result"], refused["code"]) == (
        "refused",
        "not_a_recipient",
    )
    assert "dev-2" in refused["message"]
    assert _untouched(outsider.device)
    assert not any(e.get("step") == "downloaded" for e in outsider.device.events)
    assert outsider.device.store.serial_floor("tiny") is None


async def test_a_key_wrapped_for_another_key_pair_fails_to_load_and_rolls_back(
    sealed_devices, hub: Hub, broker: Broker, tmp_path: Path
) -> None:
    device, _ = await sealed_devices("dev-1")
    stranger = open_device_key(tmp_path / "stranger")  # "dev-1" in the file, but not its key
    recipients = tmp_path / "recipients.toml"
    recipients.write_text(f'"dev-1" = "{stranger.public_text}"\n')
    release = await _sign_encrypted(hub, add_golden(hub.package("1", seed=1)), recipients)
    await publish(
        broker.settings(), [GroupTopics("edgeagent", "lab").release("tiny")], release.read_bytes()
    )

    await until(lambda: device.outcome() is not None)
    outcome = device.outcome()
    assert outcome is not None and (outcome["result"], outcome["code"]) == ("failed", "load_failed")
    assert "not wrapped for this device's key" in outcome["message"]
    assert device.device.store.current("tiny") is None
    assert device.device.store.versions("tiny") == []
    assert device.device.store.bad_versions("tiny") == {"1"}
