"""The daemon: the one composition root that builds the parts from the config and wires them.

Start order: metrics → hardware façade → model registry (every package loaded and warmed) →
HTTP listeners → services (governor, updater) → READY. Stop order is the reverse, with the
drain in the middle: STOPPING → services stop → listeners close (nothing new is accepted) →
in-flight HTTP requests finish (``[server] drain_timeout_s``) → batchers drain → sessions close
→ socket removed. Parts never import each other sideways; what one needs of another is passed
here (``limits_provider``, ``status_providers``, one CollectorRegistry).

SIGHUP (``systemctl reload``) re-reads the TLS certificate (new handshakes get it), the config
and the models directory: new packages load, changed ones hot-swap, removed ones unload; config
keys other than ``[agent] models_dir``, ``models`` and ``log_level`` and the ``[[stream]]`` tables
(cameras added, changed or removed) are reported as needing a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Protocol

from aiohttp import web

from edgeagent import __version__
from edgeagent.aio import cancel_and_wait, spawn
from edgeagent.api.announce import announcement, join_discovered
from edgeagent.api.http.app import create_app
from edgeagent.api.http.deepstack_routes import deepstack_model_problem
from edgeagent.api.listeners import ListenerError, Listeners, handler_args
from edgeagent.api.secret_files import exposures, secret_files
from edgeagent.api.shm.regions import SharedMemoryRegistry
from edgeagent.config import Config, package_dirs
from edgeagent.engine.busy_counter import LoadCounter
from edgeagent.engine.dataplane import DataPlane
from edgeagent.engine.gauges import ModelGauges
from edgeagent.engine.language.plane import LanguagePlane
from edgeagent.engine.limits import ServingLimits
from edgeagent.engine.metrics import EngineMetrics, new_registry
from edgeagent.engine.plan import plan_request
from edgeagent.engine.planes import split_text
from edgeagent.engine.registry import ModelRegistry
from edgeagent.engine.serving import ModelFactory
from edgeagent.fleet.topics import Topics
from edgeagent.governor.sensors import power_reader
from edgeagent.governor.service import GovernorService
from edgeagent.hardware.discovery import Announcement, Announcer
from edgeagent.hardware.service import Accelerators
from edgeagent.heap import limit_arenas, release_free_memory
from edgeagent.models.device_key import DeviceKeyError, open_device_key
from edgeagent.models.locate import find_packages
from edgeagent.models.package import PackageError, load_package
from edgeagent.models.unsealer import Unsealer
from edgeagent.paths import default_models_dir
from edgeagent.sdnotify import Notifier
from edgeagent.sections import ConfigError
from edgeagent.streams.service import StreamsService
from edgeagent.updates.locks import UpdateLocks

log = logging.getLogger(__name__)
# Config fields a SIGHUP applies; a change to any other is reported as needing a restart.
RELOADED = frozenset({"agent", "cameras"})


class Service(Protocol):
    """A long-running part (governor, updater): started after the models, stopped first."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class StartupError(RuntimeError):
    """The daemon cannot start (a listener, the models directory); the message says what to fix."""


class Daemon:
    """Builds and runs every part of the agent (see the module docstring)."""

    def __init__(
        self,
        config: Config,
        reread: Callable[[], Config] | None = None,
        config_file: Path | None = None,  # the file ``config`` came from, checked for exposure
    ) -> None:
        limit_arenas()  # before the worker and runtime threads exist
        self.config = config
        self._reread = reread  # SIGHUP: the config as the file now says (None: keep this one)
        self._reloading = asyncio.Lock()
        self._seeded: dict[str, Path] = {}  # model name → its package in the models directory
        self.metrics = new_registry()
        self.engine_metrics = EngineMetrics(self.metrics)
        self.notifier = Notifier()
        self.executor = ThreadPoolExecutor(
            config.engine.worker_threads, thread_name_prefix="edgeagent-infer"
        )
        config.agent.state_dir.mkdir(parents=True, exist_ok=True)
        # Before anything reads the state: move its format forwards (snapshotted for a rollback
        # while a switch to this version is on trial), or refuse a format newer than this code.
        self._prepare_state(config)
        # The key sealed releases are wrapped for: created at first start, reported for the hub.
        try:
            self.device_key = open_device_key(config.agent.state_dir)
        except DeviceKeyError as exc:
            raise StartupError(str(exc)) from exc
        secrets = secret_files(config_file, config.server, config.mqtt, config.agent.state_dir)
        for line in exposures(secrets, os.getegid()):  # a warning: the fix is one chmod
            log.warning("%s", line)
        # `fastest` keeps to the profile's power budget with the governor's power sensors.
        self.accelerators = Accelerators(
            config.hardware,
            config.agent.state_dir,
            power_reader=partial(power_reader, config.hardware.root, config.governor),
            on_demote=lambda model, key: self.engine_metrics.demotions.labels(model, key).inc(),
            unsealer=Unsealer(lambda: self.device_key.private),
            peers=config.peers,
        )
        self.engine_load = LoadCounter()  # the batchers count, the governor reads
        self.governor = GovernorService(
            config.governor,
            self.accelerators.profile,
            config.hardware.root,
            self.metrics,
            load=self.engine_load,
        )
        # The engine reads the governor's limits before every batch.
        self.limits_provider: Callable[[], ServingLimits] = self.governor.limits
        factory = ModelFactory(
            config.engine,
            executor=self.executor,
            metrics=self.engine_metrics,
            load=self.engine_load,
            limits_provider=self.limits_provider,
        )
        gauges = ModelGauges(self.engine_metrics)
        self.registry = ModelRegistry(
            # Each version serves at once: on its cached execution plan, or on the probe's
            # session until the search (``plan``, in the background) has measured one.
            lambda package: self.accelerators.open(
                package, plan_request(self.config.engine, package), search=False
            ),
            factory.build,
            settings=config.engine,
            executor=self.executor,
            on_model_load=[gauges.on_load],
            on_model_unload=[gauges.on_unload],
            locate=self._locate,
            plan=lambda package: self.accelerators.open(
                package, plan_request(self.config.engine, package)
            ),
        )
        self.dataplane = DataPlane(self.registry, config.engine, self.engine_metrics)
        # Language models: their own plane over the same gate, governor limits and load count.
        self.language = LanguagePlane(
            config.llm,
            engine=config.engine,
            metrics=self.metrics,
            gate=factory.gate,
            limits=self.limits_provider,
            load=self.engine_load,
        )
        self.status_providers: dict[str, Callable[[], dict]] = {
            "profile": self.accelerators.report,
            "models": self.registry.status,
            "device_key": self.device_key.status,  # in the MQTT state report too
        }
        self.services: list[Service] = []  # started in order after the models, stopped reversed
        self.services.append(self.governor)
        self.status_providers["governor"] = self.governor.snapshot
        self.updates = None
        # /v1/update-lock: served even with updates off, so an app's lock calls never fail
        self.update_locks = UpdateLocks(config.updates.max_lock_hold_s, config.updates.max_locks)
        if config.updates.enabled:  # recovers a half-done install before any model loads
            from edgeagent.updates.assemble import assemble_updates

            self.updates = assemble_updates(
                config.updates,
                config.mqtt,
                state_dir=config.agent.state_dir,
                device_id=config.agent.device_id or socket.gethostname(),
                registry=self.registry,
                language=self.language,
                accelerators=self.accelerators,
                locks=self.update_locks,
                metrics=self.metrics,
                limits=self.limits_provider,
                sources=self.status_providers,
            )
            self.services.append(self.updates)
            self.status_providers["updates"] = self.updates.status
            self.governor.add_listener(self.updates.reporter.refresh)  # fleet sees state changes
        self.capture = None
        if config.capture.enabled:  # off by default: a data-plane hook and its worker
            from edgeagent.capture.assemble import assemble_capture

            parts = assemble_capture(
                config.capture,
                config.agent.state_dir,
                lambda: self.device_key.private,
                device_id=config.agent.device_id or socket.gethostname(),
                dataplane=self.dataplane,
                metrics=self.metrics,
            )
            self.capture = parts.capture
            self.services += parts.services
            self.status_providers.update(parts.status)
        if config.zmq.enabled:  # Frigate's zmq detector: needs pyzmq (the zmq extra)
            from edgeagent.api.zmq.server import ZmqDetector

            zmq = ZmqDetector(config.zmq, self.dataplane, config.server.deepstack_model)
            self.services.append(zmq)
            self.status_providers["zmq"] = zmq.status
        self.streams = StreamsService.on_link(
            config.streams,
            config.cameras,
            detector=self.dataplane,
            link=self.updates.link if self.updates is not None else None,
            mqtt=config.mqtt,
            topics=Topics(
                config.mqtt.topic_prefix,
                config.updates.group,
                config.agent.device_id or socket.gethostname(),
            ),
            state_dir=config.agent.state_dir,
            recipient=lambda: self.device_key.private.public_key(),
        )
        self.services.append(self.streams)  # stops first: the cameras' last events spooled
        self.status_providers["streams"] = self.streams.status
        self.listeners = Listeners(config.tls)
        self.site_name = config.discovery.name or config.agent.device_id or socket.gethostname()
        if config.discovery.announce:  # after the listeners open, like every service
            self.services.append(Announcer(config.discovery, self._announcement))
        self.started_at = time.time()
        self._runner: web.AppRunner | None = None
        self.shared_memory = SharedMemoryRegistry(config.shared_memory)  # v2 shm regions
        self._stop = asyncio.Event()
        self._background: list[asyncio.Task] = []

    @staticmethod
    def _prepare_state(config: Config) -> None:
        """The state directory in this version's format (selfupdate.stateformat)."""
        from edgeagent.selfupdate.stateformat import StateFormatError, prepare_state

        state_dir, root = config.agent.state_dir, config.updates.agent_root
        try:
            if root is None:  # each step that rewrites files logs itself
                log.debug("%s", prepare_state(state_dir, None))
            else:  # with the switch's crash-test hook (EDGEAGENT_UPDATE_KILL_AT)
                from edgeagent.updates.install import checkpoint

                log.debug("%s", prepare_state(state_dir, root, checkpoint=checkpoint))
        except StateFormatError as exc:
            raise StartupError(str(exc)) from exc

    @property
    def listening(self) -> list[str]:
        """Where clients reach us, for the operator."""
        return self.listeners.addresses

    # ---- what /v1/status shows ---------------------------------------------------------------

    def status(self) -> dict:
        """The merged status of every part; a failing provider reports its error, not a 500."""
        report: dict = {
            "agent": {
                "version": __version__,
                "pid": os.getpid(),
                "uptime_s": round(time.time() - self.started_at, 1),
                "listening": self.listening,
            }
        }
        for key, provider in self.status_providers.items():
            try:
                report[key] = provider()
            except Exception as exc:
                log.exception("status provider %s failed", key)
                report[key] = {"error": str(exc)}
        return report

    # ---- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Load the models, open the listeners, start the services, then tell systemd READY.

        The watchdog pings from the start: loading runs on worker threads, so the event loop is
        free to ping, and a slow first probe is not mistaken for a hang.
        """
        self._background.append(spawn(self.notifier.watchdog_loop(), name="watchdog"))
        self.notifier.status("loading models")
        seeds, texts = split_text(package_dirs(self.config))
        installed, installed_texts = split_text(self.updates.package_dirs() if self.updates else [])
        for directory in seeds:
            self._seeded[self.registry.add(directory)] = directory
        for directory in installed:
            self.registry.add(directory)  # an installed release wins over its seed package
        await join_discovered(self.config.discovery, self.site_name, self.accelerators)
        await self.registry.load_all()
        await self.language.load_each(texts + installed_texts)
        served = [
            *package_dirs(self.config),
            *(self.updates.package_dirs() if self.updates else []),
        ]
        problem = deepstack_model_problem(self.config.server.deepstack_model, served)
        if problem is not None:  # DeepStack answers 403 "not activated"; the rest serves on
            log.error("%s: DeepStack's /v1/vision/detection will refuse every frame", problem)
        app = create_app(
            self.dataplane,
            settings=self.config.server,
            metrics=self.metrics,
            status=self.status,
            shared_memory=self.shared_memory,
            language=self.language,
            update_locks=self.update_locks,
        )
        self._runner = web.AppRunner(
            app,
            access_log=None,
            shutdown_timeout=self.config.engine.drain_timeout_s,
            **handler_args(self.config.server),
        )
        await self._runner.setup()
        try:
            await self.listeners.open_http(self._runner, self.config.server)
            await self.listeners.open_grpc(
                self.dataplane, self.config.grpc, self.config.server, self.shared_memory
            )
        except ListenerError as exc:
            raise StartupError(str(exc)) from exc
        self.status_providers["listeners"] = self.listeners.status
        try:
            for service in self.services:
                await service.start()
        except ListenerError as exc:  # a service's own listener ([zmq])
            raise StartupError(str(exc)) from exc
        ready = [r for r in self.registry.index() if r["state"] == "READY"]
        summary = f"serving {len(ready)} model version(s) on {', '.join(self.listening)}"
        release_free_memory()  # what loading and probing the models left behind
        self.notifier.ready(summary)
        log.info("edgeagent %s %s", __version__, summary)

    def _announcement(self) -> Announcement:
        ready = (e["name"] for e in self.registry.index() if e["state"] == "READY")
        return announcement(
            self.site_name,
            self.config.server,
            tls=self.listeners.tls is not None,
            cert_file=self.config.tls.cert_file,
            models=ready,
        )

    async def reload(self) -> None:
        """SIGHUP: apply the config's [agent] model keys and serve the models directory anew.

        A config that no longer validates is refused (logged) and the running one kept. The
        TLS certificate and key are read again first (a renewed certificate needs no new
        config), for new handshakes on every TCP listener.
        """
        async with self._reloading:
            self.listeners.reload_tls()
            if self._reread is not None:
                try:
                    config = self._reread()
                    wanted_dirs = package_dirs(config)  # a models_dir named but missing, too
                except ConfigError as exc:
                    log.error("reload refused, still running the previous config: %s", exc)
                    return
                changed = [
                    f.name
                    for f in dataclasses.fields(config)
                    if f.name not in RELOADED
                    and getattr(config, f.name) != getattr(self.config, f.name)
                ]
                if changed or config.agent.state_dir != self.config.agent.state_dir:
                    log.warning(
                        "reload: changes to %s apply after a restart", changed or "state_dir"
                    )
                self.config = dataclasses.replace(
                    self.config, agent=config.agent, cameras=config.cameras
                )
                logging.getLogger().setLevel(config.agent.log_level)
                await self.streams.apply(config.cameras)
            else:
                try:
                    wanted_dirs = package_dirs(self.config)
                except ConfigError as exc:
                    log.error("reload refused: %s", exc)
                    return
            wanted_dirs, texts = split_text(wanted_dirs)
            await self.language.reconcile(texts)
            wanted = {self.registry.add(d): d for d in wanted_dirs}
            for name in set(self._seeded) - set(wanted):
                await self.registry.unload(name)
            for name, directory in wanted.items():
                if self._serves(name, directory):
                    continue
                try:
                    await self.registry.activate(directory)
                except Exception as exc:
                    log.error("reload: model %s is unavailable: %s", name, exc)
            self._seeded = wanted
            release_free_memory()
            ready = [
                f"{r['name']} {r['version']}"
                for r in self.registry.index()
                if r["state"] == "READY"
            ]
            self.notifier.status(f"reloaded: serving {', '.join(ready) or 'nothing'}")
            log.info("reloaded: serving %s", ", ".join(ready) or "no models")

    def _locate(self, name: str) -> Path | None:
        """The models directory's package ``name`` (repository load of one added after start)."""
        try:
            return find_packages(self.config.agent.models_dir or default_models_dir()).get(name)
        except PackageError:
            return None

    def _serves(self, name: str, directory: Path) -> bool:
        """Whether the version in ``directory`` is already loaded (a reload leaves it be)."""
        try:
            return load_package(directory).version in self.registry.versions(name)
        except PackageError:
            return False  # activate() reports it

    def request_stop(self) -> None:
        """Begin the graceful shutdown (signal handler)."""
        if not self._stop.is_set():
            log.info("shutting down: draining in-flight requests")
        self._stop.set()

    async def stop(self) -> None:
        """Drain and close in order; safe to call after a partial start."""
        self.notifier.stopping()
        for service in reversed(self.services):
            try:
                await service.stop()
            except Exception:
                log.exception("stopping %s failed", type(service).__name__)
        await self.listeners.stop_grpc(self.config.engine.drain_timeout_s)
        if self._runner is not None:
            await self._runner.cleanup()  # stop accepting, then wait for in-flight handlers
        self.shared_memory.close()
        await self.language.close()
        await self.registry.close()
        await cancel_and_wait(self._background)
        self.executor.shutdown(wait=True)
        self.listeners.remove_socket()
        log.info("stopped")

    async def serve(self, on_ready: Callable[[Daemon], None] | None = None) -> None:
        """Run until SIGTERM/SIGINT, then shut down gracefully; ``on_ready`` once it serves.

        A signal during start-up (a probe that takes minutes) abandons the start at once.
        """
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
        loop.add_signal_handler(signal.SIGHUP, self._reload_soon)
        starting = asyncio.create_task(self.start())
        stopping = asyncio.create_task(self._stop.wait())
        try:
            await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not starting.done():
                starting.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await starting
                return
            starting.result()  # start-up errors end the daemon here
            if on_ready is not None:
                on_ready(self)
            await stopping
        finally:
            stopping.cancel()
            await self.stop()
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.remove_signal_handler(sig)

    def _reload_soon(self) -> None:
        """The SIGHUP handler: reload in a task (serialised by ``reload``'s lock)."""
        self._background.append(spawn(self.reload(), name="reload"))
