"""A hub and a device in one process for update tests: real keys, real signing, real HTTP
artifact server, real store, real registry with onnxruntime sessions.

Like python-tuf's repository simulator, ``Hub.release`` signs on demand and each test changes
one thing (version, key, expiry, target, artifact bytes) and then checks the reported code
*and* that the store on disk did not change.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hashlib
import io
import json
import tarfile
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from prometheus_client import CollectorRegistry

from devtools.broker import Broker
from devtools.package import add_field, rehash_files
from edgeagent.aio import cancel_and_wait
from edgeagent.engine.registry import ModelRegistry
from edgeagent.fleet.manifest import (
    Artifact,
    DeviceIdentity,
    ReleaseManifest,
    Targets,
    VariantArtifact,
)
from edgeagent.fleet.mqtt import MqttLink
from edgeagent.fleet.signing import sign_envelope
from edgeagent.fleet.topics import Topics
from edgeagent.fleet.trust import open_trust_store
from edgeagent.hardware.choose import release_variants
from edgeagent.hardware.profile import Profile, load_profiles
from edgeagent.hub.keys import keygen, load_private_key
from edgeagent.hub.serials import ReleaseSerials
from edgeagent.hub.serve import start_artifact_server
from edgeagent.hub.sign import ManifestSigner, sign_package
from edgeagent.models.session import open_variant
from edgeagent.updates.report import UpdateReporter
from edgeagent.updates.settings import UpdateSettings
from edgeagent.updates.store import ModelStore
from edgeagent.updates.updater import Updater
from tests.support.helpers import serving_registry, write_tiny_package

DEVICE = DeviceIdentity(device_id="dev-1", profile="generic_x86_64", device_class="test-box")


def add_golden(package: Path, *, rank: int = 0, count: int = 4) -> Path:
    """Give a package golden inputs whose expected class is the model's ``rank``-th choice
    (0: the true top-1; 3 of 4 classes: deliberately wrong)."""
    model_file = next(package.glob("*.onnx"))
    inputs = np.random.default_rng(7).standard_normal((count, 3, 8, 8)).astype(np.float32)
    session = ort.InferenceSession(str(model_file), providers=["CPUExecutionProvider"])
    scores = session.run(None, {"input": inputs})[0]
    top1 = np.argsort(-scores, axis=-1)[:, rank]
    np.savez(package / "golden.npz", inputs=inputs, top1=top1)
    add_field(package, "golden", "golden.npz")
    return package


def break_model(package: Path) -> Path:
    """A package that validates (the sha256 matches) but no runtime can load."""
    model_file = next(package.glob("*.onnx"))
    model_file.write_bytes(b"this is not an onnx model" * 10)
    rehash_files(package)
    return package


@dataclasses.dataclass
class Hub:
    """Keys, packages, artifacts and the HTTP server that serves them."""

    root: Path
    url: str = ""

    @property
    def keys(self) -> Path:
        return self.root / "keys"

    @property
    def artifacts(self) -> Path:
        return self.root / "artifacts"

    def package(self, version: str, *, seed: int = 0, name: str = "tiny") -> Path:
        return write_tiny_package(
            self.root / "packages" / f"{name}-{version}", name, version, seed=seed
        )

    def sign(self, package: Path, **options: Any) -> bytes:
        options.setdefault("key_paths", [self.keys / "release.key"])
        _artifact, envelope = sign_package(
            package, base_url=self.url, out_dir=self.artifacts, **options
        )
        return envelope.read_bytes()

    def sign_command(self, package: Path, *extra: str) -> list[str]:
        """The ``hub sign`` arguments that sign ``package`` into this hub's artifacts, as JSON."""
        return [
            "sign",
            str(package),
            "--key",
            str(self.keys / "release.key"),
            "--base-url",
            self.url,
            "--out",
            str(self.artifacts),
            *extra,
            "--json",
        ]

    def publish_command(
        self, release: str | Path, broker_port: int, group: str = "lab"
    ) -> list[str]:
        """The ``hub publish`` arguments that put ``release`` in ``group``'s retained slot."""
        return [
            "publish",
            str(release),
            "--group",
            group,
            "--broker",
            f"127.0.0.1:{broker_port}",
            "--trust",
            str(self.keys / "trust.json"),
        ]

    def device_tables(self, broker_port: int, **updates: Any) -> str:
        """An agent's [updates] and [mqtt] tables: releases of this hub over that broker, to
        the "lab" group; ``updates``: more [updates] keys (Python values, written as TOML)."""
        more = "".join(f"{key} = {json.dumps(value)}\n" for key, value in updates.items())
        return f"""[updates]
enabled = true
group = "lab"
device_class = "test-box"
trust_file = "{self.keys / "trust.json"}"
free_space_margin_bytes = 0
download_retries = 2
download_gap_s = 5.0
{more}
[mqtt]
port = {broker_port}
keepalive_s = 5
reconnect_min_s = 0.2
reconnect_max_s = 1.0
"""

    def signer(self) -> ManifestSigner:
        """What ``hub rollout --key`` signs each stage's envelope with."""
        return ManifestSigner([self.keys / "release.key"])

    def release(self, version: str, **options: Any) -> bytes:
        return self.sign(
            add_golden(self.package(version, seed=int(version.split(".")[0]))), **options
        )

    def next_serial(self, model: str = "tiny") -> int:
        """The serial ``hub sign`` would give the model's next release (the same counter)."""
        return ReleaseSerials(self.keys / "serials.json").next(model)

    def raw_release(
        self,
        artifact_bytes: bytes,
        model: str = "tiny",
        version: str = "9",
        variant_bytes: bytes = b"variant files",
        variant_key: tuple[str, str] = ("onnxruntime", "fp32"),
    ) -> bytes:
        """Sign a manifest for arbitrary shared and variant archive bytes (hostile archives)."""
        now = datetime.now(timezone.utc).replace(microsecond=0)

        def artifact(suffix: str, data: bytes) -> Artifact:
            name = f"{model}-{version}-raw{suffix}.tar.gz"
            (self.artifacts / name).write_bytes(data)
            return Artifact(f"{self.url}/{name}", len(data), hashlib.sha256(data).hexdigest())

        manifest = ReleaseManifest(
            model=model,
            version=version,
            serial=self.next_serial(model),
            artifact=artifact("", artifact_bytes),
            variants=(VariantArtifact(*variant_key, artifact(".variant", variant_bytes)),),
            issued_at=now,
            expires=now + timedelta(days=1),
            deployment_id=f"raw-{version}",
            targets=Targets(),
        )
        return sign_envelope(manifest.to_payload(), [load_private_key(self.keys / "release.key")])


def hostile_archive(entries: list[tuple[str, bytes] | tarfile.TarInfo]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for entry in entries:
            if isinstance(entry, tarfile.TarInfo):
                tar.addfile(entry)
            else:
                info = tarfile.TarInfo(entry[0])
                info.size = len(entry[1])
                tar.addfile(info, io.BytesIO(entry[1]))
    return buffer.getvalue()


@dataclasses.dataclass
class Device:
    """One device's update stack: store, trust, registry, reporter, updater."""

    state_dir: Path
    store: ModelStore
    registry: ModelRegistry
    updater: Updater
    events: list[dict[str, Any]]

    def serving(self, name: str = "tiny") -> str:
        return self.registry.get(name).version

    async def apply(self, envelope: bytes) -> dict[str, Any]:
        outcome = await self.updater.apply(envelope)
        assert outcome is not None
        return outcome


def profile_named(name: str = "generic-x86_64") -> Profile:
    """One of the shipped board profiles (the generic x86 one ranks CUDA, NPU, Edge TPU, CPU)."""
    return next(p for p in load_profiles() if p.name == name)


def make_device(
    state_dir: Path,
    trust_seed: Path,
    executor,
    *,
    profile: Profile | None = None,
    opener=open_variant,
    **settings: Any,
) -> Device:
    update_settings = UpdateSettings(
        enabled=True,
        device_class=DEVICE.device_class,
        free_space_margin_bytes=0,
        download_retries=1,
        download_gap_s=5.0,
        health_timeout_s=30.0,
        **{"golden_top_k": 1, **settings},
    )
    store = ModelStore(state_dir)
    store.recover()
    registry = serving_registry(opener, executor=executor)
    events: list[dict[str, Any]] = []
    reporter = UpdateReporter(DEVICE.device_id, "default", metrics=CollectorRegistry())
    reporter.connect(lambda state: None, events.append)
    updater = Updater(
        settings=update_settings,
        store=store,
        trust=open_trust_store(state_dir, seed=trust_seed, max_bytes=64 * 1024),
        registry=registry,
        device=DEVICE,
        reporter=reporter,
        choose_variants=functools.partial(
            release_variants,
            profile or profile_named(),
            cpu_fallback=update_settings.cpu_fallback_variant,
        ),
    )
    return Device(state_dir, store, registry, updater, events)


@pytest.fixture(name="hub")
async def hub_fixture(tmp_path: Path) -> AsyncIterator[Hub]:
    hub = Hub(tmp_path / "hub")
    hub.artifacts.mkdir(parents=True)
    hub.keys.mkdir(parents=True)
    keygen(hub.keys)
    runner, hub.url = await start_artifact_server(hub.artifacts)
    yield hub
    await runner.cleanup()


@pytest.fixture(name="device")
async def device_fixture(tmp_path: Path, hub: Hub) -> AsyncIterator[Device]:
    with ThreadPoolExecutor(2) as executor:
        device = make_device(tmp_path / "device", hub.keys / "trust.json", executor)
        yield device
        await device.registry.close()


class Online:
    """A device stack plus its MQTT link, as the daemon's UpdateService runs them."""

    def __init__(self, device: Device, broker: Broker, device_id: str = "dev-1") -> None:
        self.device = device
        topics = Topics("edgeagent", "lab", device_id)
        self.link = MqttLink(broker.settings(), topics, device.updater.on_message)
        device.updater.device = dataclasses.replace(device.updater.device, device_id=device_id)
        device.updater.reporter.device_id = device_id
        device.updater.reporter.group = "lab"
        device.updater.reporter.sources = {"models": device.registry.status}
        device.updater.reporter.connect(self.link.publish_state, self._event)
        self.tasks: list[asyncio.Task] = []

    def _event(self, event: dict) -> None:
        self.device.events.append(event)
        self.link.publish_event(event)

    async def start(self) -> Online:
        self.tasks = [
            asyncio.create_task(self.link.run()),
            asyncio.create_task(self.device.updater.run()),
        ]
        await asyncio.wait_for(self.link.connected.wait(), 15)
        return self

    async def stop(self) -> None:
        await self.link.close()
        await cancel_and_wait(self.tasks)

    def outcome(self) -> dict | None:
        return self.device.updater.reporter.last


@pytest.fixture(name="stacks")
async def stacks_fixture(tmp_path: Path, hub: Hub, broker: Broker) -> AsyncIterator:
    """Make online devices on demand; everything is stopped and closed afterwards."""
    made: list[Online] = []
    with ThreadPoolExecutor(2) as executor:

        async def make(device_id: str = "dev-1", state: str | None = None) -> Online:
            device = make_device(tmp_path / (state or device_id), hub.keys / "trust.json", executor)
            online = Online(device, broker, device_id)
            made.append(online)
            return online

        yield make
        for online in made:
            await online.stop()
            await online.device.registry.close()
