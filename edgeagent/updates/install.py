"""The install steps of a verified release: download ▸ unpack ▸ install ▸ activate ▸ health
▸ commit, or a canary beside the serving version, and the rollback when any of them fails.

The updater (``updates.updater``) decides *whether* a release is installed; this module only
*how*, one release at a time::

    download    the shared artifact and the chosen variants' only, each into
                staging/<sha256>.part, capped at its signed length, resumable, hashed; or
                a signed delta applied to a held base, its result hashed (``updates.deltas``)
    unpack      into staging, refusing traversal, links, devices and oversize archives, each
                variant's files beside the shared ones (``variants.installed`` lists them); the
                package's own model.toml must name the signed model and version
    install     one rename into store/<model>/<version>
    activate    ``current`` → new; the registry loads and warms it and swaps traffic over
    health      the golden inputs must give the golden answers — a classifier's top-1, a
                detector's boxes (IoU-matched), other tasks' tensors — or, without a golden
                file, a finite answer, within ``health_timeout_s``
    commit      raise the serial floor, clear the pending record, GC old releases

A language model's release is health-checked (its golden chats, on a copy the check loads)
*before* it is activated, so a release that fails never takes traffic from the version that
serves; it takes no live canary (docs/fleet/canary.md).

Before each step the step name is written to ``pending.json``, so a crash anywhere is finished
or undone by ``ModelStore.recover()`` at the next start. Any failure rolls back: ``current``
returns to the previous release, the registry swaps back to it, the new directory is deleted,
and a release that failed to load or failed its health check is marked bad so it is never
tried again.

Testing hook: ``EDGEAGENT_UPDATE_KILL_AT=<checkpoint>`` makes the process SIGKILL itself at that
checkpoint (``verified``, ``downloaded``, ``unpacked``, ``installed``, ``activating``,
``activated``, ``committing``, ``committed``), which is how the crash-safety tests stop the
agent at an exact point rather than at a random moment.

A little over 500 lines, on purpose: the steps, the canary's conclusion and the rollback share
one pending record and one ``step`` that says where a failure stopped, and are read together
(the health check itself is ``updates.health``, what it drives of the engine
``updates.activation``, the deltas ``updates.deltas``).
"""

from __future__ import annotations

import asyncio
import filecmp
import logging
import os
import shutil
import signal
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import aiohttp

from edgeagent import __version__
from edgeagent.aio import spawn
from edgeagent.engine.canary_judge import CanaryVerdict
from edgeagent.engine.limits import UNTHROTTLED, ServingLimits
from edgeagent.engine.planes import ServedText
from edgeagent.fleet import outcomes
from edgeagent.fleet.manifest import Artifact, ReleaseManifest, VariantArtifact
from edgeagent.fleet.release_ref import ReleaseRef
from edgeagent.models.package import (
    INSTALLED_VARIANTS,
    ModelPackage,
    PackageError,
    load_package,
)
from edgeagent.updates.activation import Activator, Served
from edgeagent.updates.canary_step import (
    CanaryStage,
    WaitingCanaries,
    WaitingCanary,
)
from edgeagent.updates.cancels import Cancellations
from edgeagent.updates.deltas import Deltas
from edgeagent.updates.download import ArtifactDownload, DownloadError, DownloadLimits, tls_context
from edgeagent.updates.errors import InstallFailed
from edgeagent.updates.health import health_check
from edgeagent.updates.release_memory import ReleaseMemory
from edgeagent.updates.report import UpdateReporter
from edgeagent.updates.settings import UpdateSettings
from edgeagent.updates.store import STEPS, ModelStore, PendingInstall
from edgeagent.updates.unpack import UnpackError, unpack_archive, unpack_files
from edgeagent.updates.wrapped_keys import install_wrapped_keys

log = logging.getLogger(__name__)

KILL_ENV = "EDGEAGENT_UPDATE_KILL_AT"
AGENT_BASES = "_agent"  # delta bases of agent wheelhouses (no model name starts with "_")
TEXT_CANARY = (
    "%s %s: a language model takes no live canary (the canary judge measures tensor "
    "requests); its golden chats are checked before it takes traffic, then it is hot-swapped"
)


def checkpoint(name: str) -> None:
    """The crash-test hook (see the module docstring); a no-op unless the env var names it."""
    if os.environ.get(KILL_ENV) == name:
        log.warning("%s=%s: killing this process now", KILL_ENV, name)
        os.kill(os.getpid(), signal.SIGKILL)


class Installer:
    """Runs a verified release through the steps (module docstring); rolls back on failure."""

    def __init__(
        self,
        *,
        settings: UpdateSettings,
        store: ModelStore,
        registry: Activator,
        reporter: UpdateReporter,
        memory: ReleaseMemory,
        canaries: WaitingCanaries,
        cancels: Cancellations,
        limits: Callable[[], ServingLimits] = lambda: UNTHROTTLED,
        before_swap: Callable[[ReleaseRef], Awaitable[None]] | None = None,
    ) -> None:
        self.settings = settings
        self.before_swap = before_swap  # waits while an update lock is held (updates.locks)
        self.store = store
        self.registry = registry
        self.reporter = reporter
        self.memory = memory  # a commit is remembered, and supersedes the model's last one
        self.canaries = canaries
        self.cancels = cancels  # asked once more after the download, the last moment to stop
        self.limits = limits
        self.canary = CanaryStage(settings, registry, reporter, self._golden)
        self.deltas = Deltas(
            store.root.parent / "bases", settings.keep_delta_bases, settings.max_delta_base_bytes
        )

    async def install(
        self, manifest: ReleaseManifest, variants: list[VariantArtifact], key: str, device_id: str
    ) -> asyncio.Task[None] | None:
        """Run the steps after ``verify``; any failure, expected or not, rolls back.
        ``device_id`` unwraps a sealed variant's content key.

        ``step`` names where it stopped, so an unexpected exception (a bug, or a network value
        nobody thought of) is reported as ``internal_error`` naming the step instead of
        leaving ``pending.json`` behind and wedging every later install. A canary install
        returns the task that concludes it once its canary takes traffic (``_conclude``).
        """
        release = manifest.ref()
        # A canary runs beside what serves (a first install has nothing to compare with);
        # a device that cannot hold both versions refuses before downloading anything.
        policy = None
        if manifest.canary is not None and self._served_dir(manifest.model) is not None:
            try:
                policy = self.canary.prepare(manifest.canary, variants)
            except InstallFailed as exc:
                self.reporter.outcome(release, "refused", exc.code, str(exc))
                return None
        try:
            pending = PendingInstall(
                model=manifest.model,
                version=manifest.version,
                previous=self.store.current(manifest.model),
                deployment_id=manifest.deployment_id,
                serial=manifest.serial,
            )
            self.store.begin(pending)
        except Exception as exc:  # nothing was changed yet: a refusal, the store as it was
            log.exception("cannot begin the install of %s %s", manifest.model, manifest.version)
            message = f"step 'begin' failed: {type(exc).__name__}: {str(exc)[:300]}"
            self.reporter.outcome(release, "refused", outcomes.INTERNAL_ERROR, message)
            return None
        self.reporter.progress(release, "verified")
        checkpoint("verified")
        # What to swap the registry back to on failure: False until the new release serves.
        swap_back: Path | Literal[False] | None = False
        before = self._served_dir(manifest.model)
        downloads: list[Path] = []  # completed artifacts in staging, removed when done
        step = "download"
        try:
            artifacts = (manifest.artifact, *(v.artifact for v in variants))
            downloaded = 0
            for artifact in artifacts:
                path, spent = await self.deltas.fetch(artifact, lambda a: self.download(a, release))
                downloaded += spent + (0 if path else artifact.size)
                downloads.append(path or await self.download(artifact, release))
            shared, *files = downloads
            self.store.advance(pending, "downloaded")
            self.reporter.progress(
                release, "downloaded", bytes=downloaded, variants=[v.key for v in variants]
            )
            checkpoint("downloaded")

            cancelled = self.cancels.refusal(manifest)
            if cancelled is not None:  # it came while this downloaded: the last moment to stop
                raise InstallFailed(cancelled.code, cancelled.message)

            step = "unpack"
            pairs = list(zip(variants, files, strict=True))
            unpacked, package = await self._unpack(manifest, shared, pairs, device_id)
            self.store.advance(pending, "unpacked")
            self.reporter.progress(release, "unpacked")
            checkpoint("unpacked")

            step = "install"
            installed = await asyncio.to_thread(
                self.store.install, manifest.model, manifest.version, unpacked
            )
            kept = list(zip(artifacts, downloads, strict=True))
            await asyncio.to_thread(self.deltas.keep, manifest.model, manifest.version, kept)
            self._discard(downloads)
            self.store.advance(pending, "installed")
            self.reporter.progress(release, "installed")
            checkpoint("installed")

            if package.text is not None:  # judged before it takes traffic, canary or not
                if policy is not None:
                    log.warning(TEXT_CANARY, manifest.model, manifest.version)
                    policy = None
                step = "health"
                await self._golden_text(installed, manifest.model)

            if self.before_swap is not None:  # a lock taken while this downloaded
                await self.before_swap(release)
            if policy is not None:  # the old version serves until the canary is promoted
                step = "canary"
                self.store.advance(pending, "canary")
                checkpoint("canary")
                canary = await self.canary.start(installed, policy, release)
                waiting = WaitingCanary(pending, release, key, canary)
                try:
                    self.canaries.park(waiting)
                except BaseException:  # not parked: it must not be promoted behind the store
                    canary.end("its install could not be recorded")
                    raise
                waiting.task = spawn(
                    self._conclude(waiting, before), name=f"canary-{pending.model}"
                )
                return waiting.task

            step = "activate"
            self.store.advance(pending, "activating")
            self.store.set_current(manifest.model, manifest.version)
            checkpoint("activating")
            model = await self._activate(installed)
            swap_back = before
            self.reporter.progress(release, "activated")
            checkpoint("activated")

            if package.text is None:
                step = "health"
                await self._health(model, manifest.model, installed)

            step = "commit"
            self.store.advance(pending, "committing")
            checkpoint("committing")
            self._commit(pending, release, key)
        except InstallFailed as exc:
            self._discard(downloads)
            await self._roll_back(
                pending, release, swap_back, exc.code, str(exc), bad=exc.bad, details=exc.details
            )
        except Exception as exc:
            self._discard(downloads)
            log.exception("update step %r of %s %s failed", step, manifest.model, manifest.version)
            message = f"step {step!r} failed: {type(exc).__name__}: {str(exc)[:300]}"
            await self._roll_back(
                pending, release, swap_back, outcomes.INTERNAL_ERROR, message, bad=False
            )
        return None

    async def _conclude(self, waiting: WaitingCanary, before: Path | None) -> None:
        """The rest of a parked canary install, on its verdict: commit when promoted, roll
        back otherwise (the registry has already routed accordingly)."""
        pending, release = waiting.pending, waiting.release
        swap_back: Path | Literal[False] | None = False
        step = "canary"
        try:
            verdict = await self.canary.verdict(waiting)
            swap_back = before  # promoted: the new version serves
            step = "commit"
            self.store.set_current(pending.model, pending.version)
            checkpoint("committing")
            self._commit(pending, release, waiting.key, verdict)
        except InstallFailed as exc:
            await self._roll_back(
                pending, release, swap_back, exc.code, str(exc), bad=exc.bad, details=exc.details
            )
        except Exception as exc:
            log.exception("update step %r of %s %s failed", step, pending.model, pending.version)
            message = f"step {step!r} failed: {type(exc).__name__}: {str(exc)[:300]}"
            await self._roll_back(
                pending, release, swap_back, outcomes.INTERNAL_ERROR, message, bad=False
            )

    async def _health(self, model: Served, name: str, installed: Path) -> None:
        """The health gate; a failure counts against the release only if it is its own fault.

        When the model was unloaded or replaced while the check ran (an operator's unload, not
        the release), the check proves nothing: the install rolls back without marking the
        release bad, so its re-delivery is tried again.
        """
        try:
            await self._golden(model)
        except InstallFailed as exc:
            if self._served_dir(name) != installed:
                raise InstallFailed(
                    outcomes.HEALTH_CHECK_INTERRUPTED,
                    f"{name} was unloaded or replaced during its health check ({exc})",
                ) from exc
            raise

    async def _golden_text(self, installed: Path, name: str) -> None:
        """A language release's check, on the copy that will serve it where the activator
        can place one without serving it (``Planes.stage``; activation then reuses it),
        else on a copy the check loads; a staged copy that fails is closed."""
        stage = getattr(self.registry, "stage", None)
        if stage is None:
            await self._golden(ServedText(await asyncio.to_thread(load_package, installed)))
            return
        try:
            served = await asyncio.wait_for(stage(installed), self.settings.health_timeout_s)
        except asyncio.TimeoutError as exc:
            message = f"loading took over {self.settings.health_timeout_s} s"
            raise InstallFailed(outcomes.LOAD_FAILED, message, bad=True) from exc
        except Exception as exc:
            raise InstallFailed(outcomes.LOAD_FAILED, str(exc), bad=True) from exc
        try:
            await self._golden(served)
        except BaseException:
            await self.registry.discard(name)  # type: ignore[attr-defined]
            raise

    async def _golden(self, model: Served) -> None:
        """The golden check within ``health_timeout_s``; InstallFailed when it fails."""
        settings = self.settings
        timeout_s = settings.health_timeout_s
        floor = settings.llm_tokens_per_second_floor
        try:
            await asyncio.wait_for(
                health_check(model, timeout_s, settings.golden_top_k, floor), timeout_s
            )
        except asyncio.TimeoutError as exc:
            message = f"took over {timeout_s} s"
            raise InstallFailed(outcomes.HEALTH_CHECK_FAILED, message, bad=True) from exc

    def _commit(
        self,
        pending: PendingInstall,
        release: ReleaseRef,
        key: str,
        canary: CanaryVerdict | None = None,
    ) -> None:
        """Raise the floor, then report, then drop the pending record — in that order, so a
        crash between any two steps still ends in one durable "succeeded" (recover() reports
        a raised floor as a committed install, and the reporter persists its outcomes)."""
        self.store.raise_floor(pending.model, pending.version, pending.serial)
        self.deltas.bases.retain(pending.model, pending.version)  # the next delta's base
        self.memory.remember(key)  # a re-delivered envelope is answered, not reinstalled
        self.memory.supersede(pending.model, key)
        removed = self.store.gc(pending.model, self.settings.keep_releases)
        detail = f"now serving {pending.model} {pending.version}"
        if removed:
            detail += f"; removed old release(s) {', '.join(removed)}"
        details = {}
        if canary is not None:
            detail += f"; canary promoted ({canary.reason}): {canary.summary()}"
            details["canary"] = canary.figures()
        self.reporter.outcome(release, "succeeded", outcomes.COMMITTED, detail, details=details)
        self._clear(pending)
        checkpoint("committed")

    def _clear(self, pending: PendingInstall) -> None:
        """Drop the record of a finished install: a parked canary's, or ``pending.json``."""
        if not self.canaries.finish(pending):
            self.store.clear_pending()

    async def fetch(self, artifact: Artifact, release: Mapping[str, str]) -> Path:
        """An agent release's wheelhouse: by its delta from a kept base when it can, else
        whole; its tar is kept as the base of the next one (``updates.deltas``)."""
        path, _spent = await self.deltas.fetch(artifact, lambda a: self.download(a, release))
        path = path or await self.download(artifact, release)
        version = release.get("version", "")
        await asyncio.to_thread(
            self.deltas.keep, AGENT_BASES, version, [(artifact, path)], copy=True
        )
        self.deltas.bases.retain(AGENT_BASES, version, __version__)  # the new one, and this
        return path

    async def download(self, artifact: Artifact, release: ReleaseRef | Mapping[str, str]) -> Path:
        """Fetch ``artifact`` with the device's limits (an agent release names itself by a dict)."""
        settings = self.settings
        limits = DownloadLimits(
            timeout_s=settings.download_timeout_s,
            gap_s=settings.download_gap_s,
            min_rate_bps=settings.download_min_rate_bps,
            retries=settings.download_retries,
            free_space_margin_bytes=settings.free_space_margin_bytes,
        )
        connector = aiohttp.TCPConnector(ssl=tls_context(settings.ca_file))
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=settings.download_gap_s)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as http:
            job = ArtifactDownload(
                http,
                artifact.url,
                size=artifact.size,
                sha256=artifact.sha256,
                staging=self.store.staging,
                limits=limits,
                paused=lambda: self.limits().pause_downloads,
                progress=lambda have, total: self.reporter.progress(
                    release, "downloading", bytes=have, total=total
                ),
            )
            try:
                return await job.run()
            except DownloadError as exc:
                job.discard()
                raise InstallFailed(exc.code, str(exc)) from exc

    async def _unpack(
        self,
        manifest: ReleaseManifest,
        shared: Path,
        variants: list[tuple[VariantArtifact, Path]],
        device_id: str,
    ) -> tuple[Path, ModelPackage]:
        """Unpack the shared files, add each downloaded variant's files beside them, list the
        variants in ``variants.installed`` and validate the result as a package."""
        destination = self.store.staging / f"unpack-{manifest.artifact.sha256}"
        shutil.rmtree(destination, ignore_errors=True)
        limits = {
            "max_bytes": self.settings.max_unpacked_bytes,
            "max_files": self.settings.max_unpacked_files,
            "max_header_bytes": self.settings.max_tar_header_bytes,
        }
        try:
            root = await asyncio.to_thread(unpack_archive, shared, destination, **limits)
            for variant, archive in variants:
                await asyncio.to_thread(self._add_variant, root, variant, archive, limits)
            install_wrapped_keys(root, [variant for variant, _ in variants], device_id)
            (root / INSTALLED_VARIANTS).write_text(
                "".join(f"{variant.key}\n" for variant, _ in variants), encoding="utf-8"
            )
            package = await asyncio.to_thread(load_package, root)
        except UnpackError as exc:
            shutil.rmtree(destination, ignore_errors=True)
            raise InstallFailed(outcomes.UNSAFE_ARCHIVE, str(exc)) from exc
        except PackageError as exc:
            shutil.rmtree(destination, ignore_errors=True)
            raise InstallFailed(outcomes.BAD_PACKAGE, str(exc), bad=True) from exc
        if (package.name, package.version) != (manifest.model, manifest.version):
            shutil.rmtree(destination, ignore_errors=True)
            raise InstallFailed(
                outcomes.BAD_PACKAGE,
                f"the artifact holds {package.name} {package.version}, but the signed "
                f"manifest says {manifest.model} {manifest.version}",
                bad=True,
            )
        return root, package

    @staticmethod
    def _discard(downloads: list[Path]) -> None:
        for path in downloads:
            path.unlink(missing_ok=True)

    @staticmethod
    def _add_variant(
        root: Path, variant: VariantArtifact, archive: Path, limits: dict[str, int]
    ) -> None:
        """Unpack one variant's archive beside the package root, then move its files in. A
        file already there (a shared file, or another variant's) must have the same bytes —
        two variants may share a file (OpenVINO reading the ONNX one) — or it is refused."""
        holder = root.parent / f"variant-{variant.artifact.sha256}"
        shutil.rmtree(holder, ignore_errors=True)
        unpack_files(archive, holder, **limits)
        try:
            for path in sorted(p for p in holder.rglob("*") if p.is_file()):
                target = root / path.relative_to(holder)
                if target.name == INSTALLED_VARIANTS or (
                    target.exists() and not filecmp.cmp(path, target, shallow=False)
                ):
                    raise UnpackError(f"{variant.key}: {target.name} would replace a file")
                target.parent.mkdir(parents=True, exist_ok=True)
                os.replace(path, target)
        finally:
            shutil.rmtree(holder, ignore_errors=True)

    async def _activate(self, installed: Path) -> Served:
        try:
            return await asyncio.wait_for(
                self.registry.activate(installed), self.settings.health_timeout_s
            )
        except asyncio.TimeoutError as exc:
            raise InstallFailed(
                outcomes.LOAD_FAILED,
                f"loading took over {self.settings.health_timeout_s} s",
                bad=True,
            ) from exc
        except Exception as exc:
            raise InstallFailed(outcomes.LOAD_FAILED, str(exc), bad=True) from exc

    def _served_dir(self, model: str) -> Path | None:
        """The package directory serving ``model`` now (a store release or a seed package)."""
        try:
            return self.registry.get(model).package.root
        except Exception:  # not known or not loaded: nothing to swap back to
            return None

    async def _roll_back(
        self,
        pending: PendingInstall,
        release: ReleaseRef,
        swap_back: Path | Literal[False] | None,
        code: str,
        message: str,
        *,
        bad: bool,
        details: Mapping[str, Any] | None = None,
    ) -> None:
        """Return to the previous release in the store and in the registry; report why.

        ``swap_back`` is the directory that served before the new release was activated (the
        registry is swapped back to it), False when the new one never took traffic, and None
        when nothing served before (the model is unloaded again).
        """
        model, previous = pending.model, pending.previous
        installed = STEPS.index(pending.step) >= STEPS.index("installed")
        try:
            self.store.set_current(
                model, previous if previous in self.store.versions(model) else None
            )
            if swap_back is not False:
                try:
                    if swap_back is not None:
                        await self.registry.activate(swap_back)
                    else:
                        await self.registry.unload(model)
                except Exception as exc:
                    message += f"; swapping back failed too: {exc}"
            if pending.version != previous:
                self.store.remove(model, pending.version)
                self.deltas.bases.drop(model, pending.version)
            if bad:
                self.store.mark_bad(model, pending.version)
        finally:  # whatever else failed, the next install must not find this one pending
            self._clear(pending)
        if installed:
            message = f"rolled back: {message}"
            self.reporter.outcome(release, "failed", code, message, details=details)
        else:  # nothing had been installed: the release was refused, the store is as it was
            self.reporter.outcome(release, "refused", code, message, details=details)
