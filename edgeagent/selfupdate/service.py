"""The running agent's side of a self-update: take a release and switch; confirm and commit.

In the **old** version (``apply``, from the update worker): verify the envelope under the
``agent`` role, download the wheelhouse, install it into its own venv, let the new version's
``config check`` judge the live config and its ``agent-update check-state`` the state directory
(any failure up to here is reported ``refused``: nothing switched), record the pending switch,
flip ``current``, and stop so the service manager restarts into the new version (systemd
``Restart=always``; the boot check counts that start first).

In the **new** version (``start``, with the update service): when a switch to this very version
is pending, a task confirms it — it runs after the daemon told systemd READY (the daemon's start
sends READY synchronously right after its services start, and the task first runs at the next
turn of the event loop), health-checks every model that served before the switch, within the
switch deadline — then commits: the serial becomes the floor, the state snapshot its migration
left (``stateformat``) and the pending record go, old versions are pruned, and the outcome is
reported. A failure writes the verdict and stops the
agent: the boot check, from the old code, rolls back. ``start`` also reports an outcome the boot
check left behind (a rollback), so the hub hears of every switch, and holds a switch that this
process cannot confirm to its deadline while it runs (a version whose code says another
version fails at once): a switch on trial refuses every later agent release until it ends.

``checkpoint(name)`` is the crash-test hook of the model updater (``EDGEAGENT_UPDATE_KILL_AT``):
``agent_downloaded``, ``agent_prepared``, ``agent_pending``, ``agent_switched_previous``,
``agent_switched``, ``agent_confirming``, ``agent_committing``, ``agent_committed`` (and, at
the new version's start, ``stateformat``'s ``agent_snapshotted``, ``agent_migrated``; in the
boot check's rollback, ``agent_restored``, ``agent_rolled_back``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from edgeagent import __version__
from edgeagent.aio import spawn
from edgeagent.fleet import outcomes
from edgeagent.fleet.agent_manifest import AgentRefused, verify_agent_release
from edgeagent.fleet.manifest import Artifact, DeviceIdentity, ManifestError
from edgeagent.fleet.signing import TrustError, VerificationError
from edgeagent.fleet.trust import TrustStore
from edgeagent.selfupdate import snapshot
from edgeagent.selfupdate.install import (
    InstallError,
    InstallSettings,
    check_config,
    check_state,
    install_version,
)
from edgeagent.selfupdate.layout import Layout
from edgeagent.selfupdate.state import PendingSwitch, SwitchState

log = logging.getLogger(__name__)

# A retained copy is re-delivered on every reconnect: these answers are not worth a report.
_QUIET = (outcomes.SAME_VERSION, outcomes.KNOWN_BAD)


class Reporter(Protocol):
    """The part of ``updates.report.UpdateReporter`` used here."""

    def outcome(
        self,
        release: Mapping[str, str],
        result: str,
        code: str,
        message: str,
        *,
        persist: bool = True,
    ) -> dict[str, Any]: ...

    def progress(self, release: Mapping[str, str], step: str, **detail: Any) -> None: ...


Download = Callable[[Artifact, dict[str, str]], Awaitable[Path]]


@dataclass(frozen=True)
class SwitchSettings:
    """What the switch needs from ``[updates]`` (``agent_*`` keys and the shared limits)."""

    root: Path
    config_file: Path
    keep_versions: int
    max_boots: int
    commit_deadline_s: float
    install: InstallSettings
    max_artifact_bytes: int
    clock_skew_s: float


def _stop_self() -> None:
    """Graceful stop (drain, exit 0); the service manager starts the agent again."""
    os.kill(os.getpid(), signal.SIGTERM)


class AgentUpdates:
    """Self-updates for one install root (module docstring)."""

    def __init__(
        self,
        settings: SwitchSettings,
        *,
        device: DeviceIdentity,
        reporter: Reporter,
        download: Download,
        served_models: Callable[[], list[str]],
        check_model: Callable[[str], Awaitable[None]],
        checkpoint: Callable[[str], None] = lambda name: None,
        restart: Callable[[], None] = _stop_self,
    ) -> None:
        self.settings = settings
        self.layout = Layout(settings.root)
        self.state = SwitchState(settings.root)
        self.device = device
        self.reporter = reporter
        self.download = download
        self.served_models = served_models
        self.check_model = check_model
        self.checkpoint = checkpoint
        self.restart = restart
        self.confirming: asyncio.Task[None] | None = None
        self.watching: asyncio.Task[None] | None = None  # a switch this process cannot confirm

    # --- the old version: take a release and switch ------------------------------------
    async def apply(self, envelope: bytes, trust: TrustStore) -> dict[str, Any]:
        """Verify, install, check, switch and restart; the outcome record (refusals, failures)
        or the ``switching`` progress record when the restart is on its way."""
        try:
            manifest, wheelhouse = verify_agent_release(
                envelope,
                trust,
                device=self.device,
                history=self.state.record(),
                max_artifact_bytes=self.settings.max_artifact_bytes,
                clock_skew_s=self.settings.clock_skew_s,
            )
        except TrustError as exc:
            known = isinstance(exc, AgentRefused)
            release = exc.manifest.describe() if isinstance(exc, AgentRefused) else _anonymous()
            junk = isinstance(exc, VerificationError) and not isinstance(exc, ManifestError)
            persist = not junk and not (known and exc.code in _QUIET)
            return self.reporter.outcome(release, "refused", exc.code, exc.message, persist=persist)
        release = manifest.describe()
        current = self.layout.current()
        if self.state.pending() is not None:
            return self._refuse(
                release, outcomes.SWITCH_PENDING, "a switch of the agent is on trial"
            )
        if current != __version__:
            return self._refuse(
                release,
                outcomes.NOT_AB_LAYOUT,
                f"{self.layout.current_link} names {current}, this agent is {__version__}: "
                "run it from the A/B root (edgeagent agent-update init)",
            )
        self.reporter.progress(release, "verified")
        # Until the links move nothing has changed here: a download, install or check that
        # fails is a refusal ("refused" = nothing changed; "failed" = rolled back).
        try:
            archive = await self.download(wheelhouse.artifact, release)
        except Exception as exc:
            return self._refuse(release, getattr(exc, "code", "download_failed"), str(exc))
        self.checkpoint("agent_downloaded")
        try:
            await asyncio.to_thread(self._prepare, manifest.version, archive)
        except InstallError as exc:
            shutil.rmtree(self.layout.version_dir(manifest.version), ignore_errors=True)
            return self._refuse(release, exc.code, str(exc))
        finally:
            archive.unlink(missing_ok=True)
        self.checkpoint("agent_prepared")
        pending = PendingSwitch(
            from_version=__version__,
            to_version=manifest.version,
            serial=manifest.serial,
            deployment_id=manifest.deployment_id,
            deadline=time.time() + self.settings.commit_deadline_s,
            max_boots=self.settings.max_boots,
            models=tuple(self.served_models()),
        )
        self.state.write_pending(pending)
        self.checkpoint("agent_pending")
        self.layout.switch(manifest.version, self.checkpoint)
        self.checkpoint("agent_switched")
        self.reporter.progress(release, "switching")
        log.warning("agent %s installed; restarting into it", manifest.version)
        self.restart()
        return {"result": "switching", "version": manifest.version}

    def _prepare(self, version: str, archive: Path) -> None:
        install_version(self.layout, version, archive, self.settings.install)
        for check in (check_config, check_state):
            check(self.layout, version, self.settings.config_file, self.settings.install.timeout_s)

    def _refuse(self, release: dict[str, str], code: str, message: str) -> dict[str, Any]:
        return self.reporter.outcome(release, "refused", code, message)

    # --- the new version: confirm and commit -------------------------------------------
    def start(self) -> None:
        """Report what the boot check left; confirm a switch to this version if one is on.

        A switch on trial that this process does not confirm — its code says another version
        than the directory it runs from, or it is not the version switched to — still ends by
        its deadline while the agent runs (``_expire``), not at the next start only: until it
        ends every later agent release is refused (``switch_pending``)."""
        left = self.state.take_outcome()
        if left is not None:
            self.reporter.outcome(left["release"], left["result"], left["code"], left["message"])
        pending = self.state.pending()
        if pending is None:
            return
        on_trial = self.layout.current() == pending.to_version
        if on_trial and pending.to_version == __version__:
            self.confirming = spawn(self._confirm(pending), name="agent-confirm")
        elif on_trial and _runs_from(self.layout.venv(pending.to_version)):
            self.watching = spawn(self._mismatch(pending), name="agent-version-mismatch")
        else:
            self.watching = spawn(self._expire(pending), name="agent-switch-deadline")

    async def _mismatch(self, pending: PendingSwitch) -> None:
        self._fail(
            pending,
            outcomes.VERSION_MISMATCH,
            f"{self.layout.venv(pending.to_version)} runs agent {__version__}, not "
            f"{pending.to_version}: it cannot confirm the switch",
        )

    async def _expire(self, pending: PendingSwitch) -> None:
        """At the switch's deadline, fail it unless it was decided meanwhile."""
        await asyncio.sleep(max(0.0, pending.deadline - time.time()))
        now = self.state.pending()
        if now is not None and not now.verdict and now.serial == pending.serial:
            self._fail(now, outcomes.DEADLINE, "not committed within the switch deadline")

    async def _confirm(self, pending: PendingSwitch) -> None:
        self.checkpoint("agent_confirming")
        self.reporter.progress(pending.release, "confirming", boot=pending.boots)
        try:
            await asyncio.wait_for(self._check(pending), max(0.0, pending.deadline - time.time()))
        except asyncio.TimeoutError:
            self._fail(pending, outcomes.DEADLINE, "not healthy within the switch deadline")
            return
        except Exception as exc:
            self._fail(pending, getattr(exc, "code", "health_check_failed"), str(exc))
            return
        message = (
            f"agent {pending.from_version} -> {pending.to_version} (serial {pending.serial}): "
            f"READY, {len(pending.models)} model(s) healthy"
        )
        self.state.commit(pending.to_version, pending.serial)
        self.checkpoint("agent_committing")
        # left first: a crash before the report below still reports it at the next start
        self.state.leave_outcome(pending.release, "succeeded", "committed", message)
        snapshot.discard(self.layout.root)  # no way back to the old format from here on
        self.state.clear_pending()
        self.checkpoint("agent_committed")
        pruned = self.layout.prune(self.settings.keep_versions, bad=self.state.record().bad)
        if self.state.take_outcome() is not None:
            pruning = f"; pruned {', '.join(pruned)}" if pruned else ""
            self.reporter.outcome(
                pending.release, "succeeded", outcomes.COMMITTED, message + pruning
            )

    async def _check(self, pending: PendingSwitch) -> None:
        for name in pending.models:
            await self.check_model(name)

    def _fail(self, pending: PendingSwitch, code: str, message: str) -> None:
        log.error("agent %s failed its switch: %s: %s", pending.to_version, code, message)
        self.state.write_pending(pending.failed(code, message))  # the boot check rolls back
        self.restart()

    async def stop(self) -> None:
        for task in (self.confirming, self.watching):
            if task is not None and not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    def status(self) -> dict[str, Any]:
        pending = self.state.pending()
        record = self.state.record()
        return {
            "root": str(self.layout.root),
            "current": self.layout.current(),
            "previous": self.layout.previous(),
            "installed": self.layout.installed(),
            "serial": record.serial,
            "bad": record.bad,
            "pending": None if pending is None else pending.release | {"boots": pending.boots},
        }


def _runs_from(venv: Path) -> bool:
    """Whether this interpreter is the one of ``venv`` (a version's own venv)."""
    try:
        return Path(sys.prefix).resolve() == venv.resolve()
    except OSError:
        return False


def _anonymous() -> dict[str, str]:
    return {"model": "edgeagent", "version": "", "deployment_id": ""}
