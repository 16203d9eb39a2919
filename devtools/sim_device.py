"""One simulated device: the agent's real update client with a stub in place of the model.

Everything a device does for an update is the daemon's own code — ``UpdateService`` builds the
``ModelStore`` (its own state directory), ``TrustStore``, ``UpdateReporter``, ``Updater`` and
``MqttLink`` exactly as the daemon does — so a release is verified, downloaded from ``hub
serve`` (length-capped, SHA-256 checked), unpacked, installed, activated, health-checked and
committed, and every event and state report goes out on the real topics. Only the model load
and inference are replaced: ``StubRegistry.activate`` reads the package (``load_package``) but
loads no runtime, and its "inference" answers zeros — or NaN for a version the device is told
to fail (``fail_versions``), which the real health check catches and rolls back.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry

from edgeagent.engine.limits import UNTHROTTLED
from edgeagent.fleet.settings import MqttSettings
from edgeagent.fleet.topics import Topics
from edgeagent.hardware.choose import release_variants
from edgeagent.hardware.profile import Profile
from edgeagent.models.package import ModelPackage, load_package
from edgeagent.updates.service import UpdateService
from edgeagent.updates.settings import UpdateSettings


@dataclass
class StubModel:
    """A "loaded" package: the real parsed package, a stub inference."""

    package: ModelPackage
    fails: bool

    async def infer(
        self, feeds: dict[str, np.ndarray], *, priority: int = 0, timeout_s: float | None = None
    ) -> dict[str, np.ndarray]:
        value = np.nan if self.fails else 0.0
        return {out.name: np.full((1, 4), value, np.float32) for out in self.package.outputs}


@dataclass
class StubRegistry:
    """The ``Activator`` the updater drives, without a runtime (module docstring)."""

    fail_versions: Collection[str] = ()
    loaded: dict[str, StubModel] = field(default_factory=dict)

    async def activate(self, package_dir: Path) -> StubModel:
        package = load_package(package_dir)
        model = StubModel(package, fails=package.version in self.fail_versions)
        self.loaded[package.name] = model
        return model

    async def unload(self, name: str) -> None:
        self.loaded.pop(name, None)

    def get(self, name: str) -> StubModel:
        return self.loaded[name]

    def status(self) -> dict[str, Any]:
        """The state report's ``models`` part, in the registry's own shape."""
        return {
            name: {
                "state": "READY",
                "active_version": model.package.version,
                "versions": {
                    model.package.version: {
                        "runtime": "onnxruntime",
                        "device": "CPUExecutionProvider (stub: no inference)",
                        "precision": "fp32",
                    }
                },
            }
            for name, model in self.loaded.items()
        }


@dataclass(frozen=True)
class DevicePlan:
    """Who one simulated device is (plain data: it crosses a process boundary)."""

    device_id: str
    group: str
    profile: str  # a shipped board profile's name
    fail_versions: tuple[str, ...] = ()


class SimDevice:
    """``UpdateService`` around a ``StubRegistry``; records when a release message arrived
    (observed between the MQTT link and the updater), when each release was verified and when
    it ended (the reporter's events, observed on their way to the link)."""

    def __init__(
        self,
        spec: DevicePlan,
        profile: Profile,
        mqtt: MqttSettings,
        trust_file: Path,
        state_dir: Path,
    ) -> None:
        self.spec = spec
        self.registry = StubRegistry(spec.fail_versions)
        settings = UpdateSettings(
            enabled=True,
            group=spec.group,
            trust_file=trust_file,
            free_space_margin_bytes=0,
            download_retries=10,  # a loaded benchmark machine makes for slow answers
            health_timeout_s=120.0,
        )
        self.service = UpdateService(
            settings,
            mqtt,
            state_dir=state_dir,
            device_id=spec.device_id,
            registry=self.registry,
            metrics=CollectorRegistry(),
            limits=lambda: UNTHROTTLED,
            sources={
                "profile": lambda: {"profile": profile.name, "board": {"model": "simulated"}},
                "models": self.registry.status,
                "governor": lambda: {"state": "normal", "temperatures": []},
            },
            choose_variants=functools.partial(release_variants, profile),
            profile=profile.name,
        )
        self.verified: dict[str, float] = {}  # version → when the updater verified it
        self.ended: dict[str, tuple[float, str]] = {}  # version → (when, result)
        self.on_end: Callable[[], None] = lambda: None  # told after every ended install
        self.received_at: float | None = None  # when the last release message arrived
        # envelopes the broker delivered on this device's own release topic (the hub's sends)
        self.direct_releases = 0
        self._direct_topic = Topics(mqtt.topic_prefix, spec.group, spec.device_id).device_release

    async def start(self) -> None:
        """Start the service (it connects in the background); see ``connected``."""
        await self.service.start()
        reporter = self.service.reporter
        forward = reporter.publish_event

        def observe(event: dict[str, Any]) -> None:
            version = str(event.get("version", ""))
            if event.get("step") == "verified":
                self.verified[version] = time.time()
            elif event.get("step") == "done":
                self.ended[version] = (time.time(), str(event.get("result", "")))
                self.on_end()
            forward(event)

        reporter.publish_event = observe
        link = self.service.link
        handle = link.handler

        async def received(topic: str, payload: bytes) -> None:
            self.received_at = time.time()
            if topic == self._direct_topic:
                self.direct_releases += 1
            await handle(topic, payload)

        link.handler = received

    @property
    def connected(self) -> bool:
        return self.service.link.connected.is_set()

    def serving(self, model: str) -> str | None:
        loaded = self.registry.loaded.get(model)
        return None if loaded is None else loaded.package.version

    async def stop(self) -> None:
        await self.service.stop()
