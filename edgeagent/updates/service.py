"""The updater wired into the daemon: recovery at start, the MQTT link, the install worker, the
state heartbeat, and agent self-updates routed to ``selfupdate``.

Apart from ``updates.updater`` so that the rules of taking a release do not carry the daemon's
plumbing (python-tuf keeps its fetcher apart from its updater the same way), and so that a
test drives an ``Updater`` without a broker.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from edgeagent.aio import cancel_and_wait, spawn
from edgeagent.engine.limits import ServingLimits
from edgeagent.fleet import outcomes
from edgeagent.fleet.manifest import DeviceIdentity
from edgeagent.fleet.mqtt import MqttLink
from edgeagent.fleet.release_ref import ReleaseRef
from edgeagent.fleet.settings import MqttSettings
from edgeagent.fleet.signing import TrustError
from edgeagent.fleet.topics import Topics
from edgeagent.fleet.trust import open_trust_store
from edgeagent.sections import ConfigError
from edgeagent.selfupdate.install import InstallSettings
from edgeagent.selfupdate.service import AgentUpdates, SwitchSettings
from edgeagent.updates.activation import Activator
from edgeagent.updates.canary_step import recover_parked
from edgeagent.updates.install import checkpoint
from edgeagent.updates.locks import UpdateGate
from edgeagent.updates.report import UpdateReporter
from edgeagent.updates.settings import UpdateSettings
from edgeagent.updates.store import ModelStore
from edgeagent.updates.updater import Updater, VariantChoice


class UpdateService:
    """The updater as one of the daemon's services: recovery, MQTT link, install worker.

    Built before the registry loads anything, because ``recover()`` must settle a half-done
    install first; ``package_dirs()`` then tells the daemon which store releases to serve
    (they take precedence over the seed packages of the same name).
    """

    def __init__(
        self,
        settings: UpdateSettings,
        mqtt: MqttSettings,
        *,
        state_dir: Path,
        device_id: str,
        registry: Activator,
        metrics: CollectorRegistry,
        limits: Callable[[], ServingLimits],
        sources: Mapping[str, Callable[[], dict[str, Any]]],
        choose_variants: VariantChoice,
        profile: str = "",
        gate: UpdateGate | None = None,
    ) -> None:
        self.store = ModelStore(state_dir)
        recovery = self.store.recover()
        parked = recover_parked(self.store, recovery.pending if recovery else None)
        self.recoveries = [*([recovery] if recovery else []), *parked]
        try:
            trust = open_trust_store(
                state_dir,
                seed=settings.trust_file,
                max_bytes=settings.max_manifest_bytes,
            )
        except TrustError as exc:
            raise ConfigError(f"[updates] trust_file: {exc.message}") from exc
        self.reporter = UpdateReporter(
            device_id,
            settings.group,
            sources=sources,
            metrics=metrics,
            state_file=self.store.root / "report.json",
            max_state_bytes=settings.max_state_bytes,
        )
        self.updater = Updater(
            settings=settings,
            store=self.store,
            trust=trust,
            registry=registry,
            device=DeviceIdentity(device_id, profile, settings.device_class),
            reporter=self.reporter,
            choose_variants=choose_variants,
            limits=limits,
            gate=gate,
        )
        if settings.agent_root is not None:
            self.updater.agent = _agent_updates(settings, self.updater)
        topics = Topics(mqtt.topic_prefix, settings.group, device_id)
        self.link = MqttLink(mqtt, topics, self.updater.on_message)
        self._tasks: list[asyncio.Task] = []

    def package_dirs(self) -> list[Path]:
        """The current release of every model in the store (served instead of its seed)."""
        return list(self.store.current_dirs().values())

    async def start(self) -> None:
        self.reporter.connect(self.link.publish_state, self.link.publish_event)
        for recovery in self.recoveries:
            pending = recovery.pending
            release = ReleaseRef(pending.model, pending.version, pending.deployment_id)
            if recovery.outcome == "committed":  # the store's word for how recovery ended
                result, code = "succeeded", outcomes.RECOVERED_COMMITTED
            else:
                result, code = "failed", outcomes.RECOVERED_ROLLED_BACK
            self.reporter.outcome(release, result, code, recovery.reason)
        if self.updater.agent is not None:  # report a rollback; confirm a switch on trial
            self.updater.agent.start()
        self._tasks = [
            spawn(self.link.run(), name="mqtt-link"),
            spawn(self.updater.run(), name="update-worker"),
        ]
        if self.updater.settings.state_interval_s > 0:
            self._tasks.append(spawn(self._heartbeat(), name="state-heartbeat"))

    async def _heartbeat(self) -> None:
        """Re-publish the state report every ``state_interval_s``, changed or not.

        Sent only on a change, the report of a quiet, healthy device would look as stale to
        the hub as a dead one's whose Last Will was lost, and its temperature history would
        have no points between changes. The link keeps only the latest report, so a heartbeat
        while the broker is away costs nothing but the newest copy."""
        interval = self.updater.settings.state_interval_s
        while True:
            await asyncio.sleep(interval)  # the timer itself; nothing waits on it
            self.reporter.refresh()

    async def stop(self) -> None:
        await self.link.close()
        # a canary still waiting stays parked, and the next start rolls it back (recover_parked)
        tasks = [*self._tasks, *self.updater.canaries.tasks()]
        await cancel_and_wait(tasks, self.link.settings.connect_timeout_s + 5.0)
        if self.updater.agent is not None:
            await self.updater.agent.stop()

    def status(self) -> dict[str, Any]:
        agent = {} if self.updater.agent is None else {"agent": self.updater.agent.status()}
        return {**self.updater.status(), "mqtt": self.link.status(), **agent}


def _agent_updates(settings: UpdateSettings, updater: Updater) -> AgentUpdates:
    """Self-updates wired to the updater's download, reporter, registry and crash hook."""
    assert settings.agent_root is not None
    return AgentUpdates(
        SwitchSettings(
            root=settings.agent_root,
            config_file=settings.agent_config_file,
            keep_versions=settings.agent_keep_versions,
            max_boots=settings.agent_max_boots,
            commit_deadline_s=settings.agent_commit_deadline_s,
            install=InstallSettings(
                timeout_s=settings.agent_install_timeout_s,
                max_unpacked_bytes=settings.max_unpacked_bytes,
                extra_site_dirs=tuple(settings.agent_extra_site_dirs),
            ),
            max_artifact_bytes=settings.max_artifact_bytes,
            clock_skew_s=settings.clock_skew_s,
        ),
        device=updater.device,
        reporter=updater.reporter,
        download=updater.installer.fetch,
        served_models=updater.ready_models,
        check_model=updater.serves,
        checkpoint=checkpoint,
    )
