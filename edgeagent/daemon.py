"""The daemon: the one composition root that builds the parts from the config and wires them.

Start order: metrics → hardware façade → model registry (every package loaded and warmed) →
HTTP listeners → services (governor, updater) → READY. Stop order is the reverse, with the
drain in the middle: STOPPING → services stop → listeners close (nothing new is accepted) →
in-flight HTTP requests finish (``[server] drain_timeout_s``) → batchers drain → sessions close
→ socket removed. Parts never import each other sideways; what one needs of another is passed
here (``limits_provider``, ``status_providers``, one CollectorRegistry).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

from aiohttp import web

from edgeagent import __version__
from edgeagent.api.http import create_app
from edgeagent.config import Config
from edgeagent.engine.dataplane import DataPlane
from edgeagent.engine.limits import ServingLimits
from edgeagent.engine.metrics import EngineMetrics, new_registry
from edgeagent.engine.registry import ModelRegistry
from edgeagent.governor.service import GovernorService
from edgeagent.hardware.service import Accelerators
from edgeagent.paths import default_models_dir
from edgeagent.sdnotify import Notifier
from edgeagent.sections import ConfigError

log = logging.getLogger(__name__)


class Service(Protocol):
    """A long-running part (governor, updater): started after the models, stopped first."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class StartupError(RuntimeError):
    """The daemon cannot start (a listener, the models directory); the message says what to fix."""


def package_dirs(config: Config) -> list[Path]:
    """The seed packages to serve: every package in the models directory, or those named.

    ``[agent] models_dir`` when set, else the default (``$EDGEAGENT_MODELS_DIR``, ./zoo, the
    state directory's models/), so a fresh checkout serves the demo zoo with no config.
    """
    directory = config.agent.models_dir or default_models_dir()
    found = (
        {p.name: p for p in sorted(directory.iterdir()) if (p / "model.toml").is_file()}
        if directory.is_dir()
        else {}
    )
    if not config.agent.models:
        if not found:
            log.warning("no model packages in %s: serving nothing until one is loaded", directory)
        return list(found.values())
    missing = [name for name in config.agent.models if name not in found]
    if missing:
        raise ConfigError(
            f"[agent] models: no package {', '.join(map(repr, missing))} in {directory} "
            f"(found: {', '.join(found) or 'none'})"
        )
    return [found[name] for name in config.agent.models]


class Daemon:
    """Builds and runs every part of the agent (see the module docstring)."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.metrics = new_registry()
        self.engine_metrics = EngineMetrics(self.metrics)
        self.notifier = Notifier()
        self.executor = ThreadPoolExecutor(
            config.engine.worker_threads, thread_name_prefix="edgeagent-infer"
        )
        config.agent.state_dir.mkdir(parents=True, exist_ok=True)
        self.accelerators = Accelerators(config.hardware, config.agent.state_dir)
        self.governor = GovernorService(
            config.governor, self.accelerators.profile, config.hardware.root, self.metrics
        )
        # The engine reads the governor's limits before every batch.
        self.limits_provider: Callable[[], ServingLimits] = self.governor.limits
        self.registry = ModelRegistry(
            self.accelerators.open,
            settings=config.engine,
            metrics=self.engine_metrics,
            executor=self.executor,
            limits_provider=self.limits_provider,
        )
        self.dataplane = DataPlane(self.registry, config.engine)
        self.status_providers: dict[str, Callable[[], dict]] = {
            "profile": self.accelerators.report,
            "models": self.registry.status,
        }
        self.services: list[Service] = []  # started in order after the models, stopped reversed
        self.services.append(self.governor)
        self.status_providers["governor"] = self.governor.snapshot
        self.updates = None
        if config.updates.enabled:  # recovers a half-done install before any model loads
            from edgeagent.hardware.choose import release_variants
            from edgeagent.updates.updater import UpdateService

            profile = self.accelerators.profile

            self.updates = UpdateService(
                config.updates,
                config.mqtt,
                state_dir=config.agent.state_dir,
                device_id=config.agent.device_id or socket.gethostname(),
                registry=self.registry,
                metrics=self.metrics,
                limits=self.limits_provider,
                sources=self.status_providers,
                choose_variants=lambda available: release_variants(
                    profile,
                    available,
                    cpu_fallback=config.updates.cpu_fallback_variant,
                    failed=self.accelerators.failed_candidates(),
                ),
                profile=profile.name,
            )
            self.services.append(self.updates)
            self.status_providers["updates"] = self.updates.status
            self.governor.add_listener(self.updates.reporter.refresh)  # fleet sees state changes
        self.listening: list[str] = []  # where clients reach us, for the operator
        self.started_at = time.time()
        self._runner: web.AppRunner | None = None
        self._socket_path: Path | None = None
        self._stop = asyncio.Event()
        self._background: list[asyncio.Task] = []

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
        self._background.append(asyncio.create_task(self.notifier.watchdog_loop()))
        self.notifier.status("loading models")
        for directory in package_dirs(self.config):
            self.registry.add(directory)
        for directory in self.updates.package_dirs() if self.updates else []:
            self.registry.add(directory)  # an installed release wins over its seed package
        await self.registry.load_all()
        app = create_app(
            self.dataplane, settings=self.config.server, metrics=self.metrics, status=self.status
        )
        self._runner = web.AppRunner(
            app, access_log=None, shutdown_timeout=self.config.engine.drain_timeout_s
        )
        await self._runner.setup()
        await self._listen(self._runner)
        for service in self.services:
            await service.start()
        ready = [r for r in self.registry.index() if r["state"] == "READY"]
        summary = f"serving {len(ready)} model version(s) on {', '.join(self.listening)}"
        self.notifier.ready(summary)
        log.info("edgeagent %s %s", __version__, summary)

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
        if self._runner is not None:
            await self._runner.cleanup()  # stop accepting, then wait for in-flight handlers
        await self.registry.close()
        for task in self._background:
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        self.executor.shutdown(wait=True)
        if self._socket_path is not None:
            with contextlib.suppress(FileNotFoundError):
                self._socket_path.unlink()
        log.info("stopped")

    async def serve(self, on_ready: Callable[[Daemon], None] | None = None) -> None:
        """Run until SIGTERM/SIGINT, then shut down gracefully; ``on_ready`` once it serves.

        A signal during start-up (a probe that takes minutes) abandons the start at once.
        """
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop)
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
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)

    # ---- listeners ---------------------------------------------------------------------------

    async def _listen(self, runner: web.AppRunner) -> None:
        server = self.config.server
        if server.unix_socket is not None:
            path = Path(server.unix_socket)
            _claim_socket_path(path)
            site = web.UnixSite(runner, str(path))
            try:
                await site.start()
            except OSError as exc:
                raise StartupError(
                    f"cannot listen on {path}: {exc.strerror} ([server] unix_socket, --socket)"
                ) from exc
            os.chmod(path, server.socket_mode)
            self._socket_path = path
            self.listening.append(str(path))
        if server.tcp_port:
            tcp = web.TCPSite(runner, server.tcp_host, server.tcp_port)
            try:
                await tcp.start()
            except OSError as exc:
                raise StartupError(
                    f"cannot listen on {server.tcp_host}:{server.tcp_port}: {exc.strerror} "
                    "([server] tcp_host / tcp_port, --port)"
                ) from exc
            host = f"[{server.tcp_host}]" if ":" in server.tcp_host else server.tcp_host
            self.listening.append(f"http://{host}:{server.tcp_port}")
        if not self.listening:
            raise StartupError("no listener: set [server] unix_socket or tcp_port")


def _claim_socket_path(path: Path) -> None:
    """Create the socket's directory, and remove a stale socket that nobody listens on."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o750)
    if not path.exists() and not path.is_symlink():
        return
    if not path.is_socket():
        raise StartupError(f"{path} exists and is not a socket; remove it or set --socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError as exc:
        if exc.errno not in (errno.ECONNREFUSED, errno.ENOENT):
            raise StartupError(f"cannot check {path}: {exc.strerror}") from exc
        path.unlink()  # a leftover of a daemon that died
    else:
        raise StartupError(f"{path}: another edgeagent is already listening there")
    finally:
        probe.close()
