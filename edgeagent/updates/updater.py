"""The install state machine: hint → verify → download → unpack → install → activate → commit.

Each received release envelope runs through these steps, one release at a time::

    verify      signatures, then manifest (format 2), expiry, target, serial floor, bad list
                (``verify_release``), the retained slot's model, which variants this
                device runs (its profile ranking), and that a sealed one is wrapped for this
                device (``not_a_recipient``); a refusal changes nothing and is reported
    download    the shared artifact and the chosen variants' only, each into
                staging/<sha256>.part, capped at its signed length, resumable, hashed
    unpack      into staging, refusing traversal, links, devices and oversize archives, each
                variant's files beside the shared ones (``variants.installed`` lists them); the
                package's own model.toml must name the signed model and version
    install     one rename into store/<model>/<version>
    activate    ``current`` → new; the registry loads and warms it and swaps traffic over
    health      the golden inputs must give the golden answers — a classifier's top-1, a
                detector's boxes (IoU-matched), other tasks' tensors — or, without a golden
                file, a finite answer, within ``health_timeout_s``
    commit      raise the serial floor, clear the pending record, GC old releases

Before each step the step name is written to ``pending.json``, so a crash anywhere is finished
or undone by ``ModelStore.recover()`` at the next start. Any failure after ``verify`` rolls
back: ``current`` returns to the previous release, the registry swaps back to it, the new
directory is deleted, and a release that failed to load or failed its health check is marked
bad so it is never tried again.

Testing hook: ``EDGEAGENT_UPDATE_KILL_AT=<checkpoint>`` makes the process SIGKILL itself at that
checkpoint (``verified``, ``downloaded``, ``unpacked``, ``installed``, ``activating``,
``activated``, ``committing``, ``committed``), which is how the crash-safety tests stop the
agent at an exact point rather than at a random moment.
"""

from __future__ import annotations

import asyncio
import filecmp
import hashlib
import json
import logging
import os
import shutil
import signal
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal, Protocol

import aiohttp
import numpy as np
from prometheus_client import CollectorRegistry

from edgeagent.aio import cancel_and_wait, spawn
from edgeagent.engine.canary import CanaryVerdict
from edgeagent.engine.limits import UNTHROTTLED, ServingLimits
from edgeagent.fleet import outcomes
from edgeagent.fleet.agent_manifest import AGENT_SLOT, KIND, claimed_kind
from edgeagent.fleet.cancel import KIND as CANCEL
from edgeagent.fleet.manifest import (
    Artifact,
    DeviceIdentity,
    ManifestError,
    ReleaseManifest,
    ReleaseRefused,
    VariantArtifact,
    verify_release,
)
from edgeagent.fleet.mqtt import MqttLink
from edgeagent.fleet.release_ref import ReleaseRef
from edgeagent.fleet.settings import MqttSettings
from edgeagent.fleet.signing import TrustError, VerificationError
from edgeagent.fleet.topics import Topics, purpose_of, release_model
from edgeagent.fleet.trust import TrustStore, open_trust_store
from edgeagent.fsutil import write_json_atomic
from edgeagent.models.golden import GoldenError, load_golden, sample_feeds
from edgeagent.models.package import (
    INSTALLED_VARIANTS,
    VERSION_RE,
    ModelPackage,
    PackageError,
    load_package,
)
from edgeagent.sections import ConfigError
from edgeagent.selfupdate.install import InstallSettings
from edgeagent.selfupdate.service import AgentUpdates, SwitchSettings
from edgeagent.updates.canary import (
    CanaryRegistry,
    CanaryStage,
    WaitingCanaries,
    WaitingCanary,
    recover_parked,
)
from edgeagent.updates.cancels import Cancellations
from edgeagent.updates.download import ArtifactDownload, DownloadError, DownloadLimits, tls_context
from edgeagent.updates.errors import InstallFailed
from edgeagent.updates.report import UpdateReporter
from edgeagent.updates.sealed import install_wrapped_keys, recipient_refusal
from edgeagent.updates.settings import UpdateSettings
from edgeagent.updates.store import STEPS, ModelStore, PendingInstall
from edgeagent.updates.unpack import UnpackError, unpack_archive, unpack_files

log = logging.getLogger(__name__)

KILL_ENV = "EDGEAGENT_UPDATE_KILL_AT"
_REMEMBERED = 64  # accepted envelopes remembered, so a re-delivered one is ignored quietly


class Served(Protocol):
    """What the registry's LoadedModel offers the health check."""

    package: ModelPackage

    async def infer(
        self, feeds: dict[str, np.ndarray], *, priority: int = 0, timeout_s: float | None = None
    ) -> dict[str, np.ndarray]: ...


class Activator(CanaryRegistry, Protocol):
    """The part of ModelRegistry the updater drives (hot swap in, hot swap back, unload, and
    a canary beside the serving version)."""

    async def activate(self, package_dir: Path) -> Served: ...

    async def unload(self, name: str) -> None: ...

    def get(self, name: str) -> Served: ...


VariantChoice = Callable[[Sequence[str]], list[str]]
"""Which of a release's variant keys (``runtime/precision``) this device downloads, best
first (``hardware.choose.release_variants`` over the board's profile)."""


def checkpoint(name: str) -> None:
    """The crash-test hook (see the module docstring); a no-op unless the env var names it."""
    if os.environ.get(KILL_ENV) == name:
        log.warning("%s=%s: killing this process now", KILL_ENV, name)
        os.kill(os.getpid(), signal.SIGKILL)


async def health_check(model: Served, timeout_s: float, top_k: int = 1) -> None:
    """Run the package's golden inputs and hold the answers to the task's golden record: each
    expected class in the model's top-k for a classifier, every golden box found again
    (IoU-matched, score within the recorded tolerance, no extra confident box) for a detector
    whose golden file holds boxes, tensors within the recorded tolerance otherwise.

    Without golden inputs the model must at least answer the sample feeds with finite outputs.
    """
    package = model.package
    try:
        golden = load_golden(package)
    except GoldenError as exc:
        raise InstallFailed(outcomes.HEALTH_CHECK_FAILED, str(exc), bad=True) from exc
    feeds = golden.feeds if golden is not None else sample_feeds(package)
    try:
        outputs = await model.infer(feeds, priority=0, timeout_s=timeout_s)
    except Exception as exc:
        message = f"golden inference failed: {exc}"
        raise InstallFailed(outcomes.HEALTH_CHECK_FAILED, message, bad=True) from exc
    if not all(np.all(np.isfinite(np.asarray(value))) for value in outputs.values()):
        raise InstallFailed(
            outcomes.HEALTH_CHECK_FAILED, "the model answers NaN or infinity", bad=True
        )
    problem = golden.problem(outputs, top_k) if golden is not None else ""
    if problem:
        hint = " ([updates] golden_top_k)" if package.task == "classification" else ""
        raise InstallFailed(outcomes.HEALTH_CHECK_FAILED, problem + hint, bad=True)


class Updater:
    """Installs verified releases into the store and the running registry (module docstring)."""

    def __init__(
        self,
        *,
        settings: UpdateSettings,
        store: ModelStore,
        trust: TrustStore,
        registry: Activator,
        device: DeviceIdentity,
        reporter: UpdateReporter,
        choose_variants: VariantChoice,
        limits: Callable[[], ServingLimits] = lambda: UNTHROTTLED,
    ) -> None:
        self.settings = settings
        self.choose_variants = choose_variants
        self.store = store
        self.trust = trust
        self.registry = registry
        self.device = device
        self.reporter = reporter
        self.limits = limits
        self.canary = CanaryStage(settings, registry, reporter, self._golden)
        self.canaries = WaitingCanaries(store)  # parked installs, their verdicts to come
        # Release hints waiting for the worker, newest per topic: a burst on one topic (junk
        # or a re-publish) replaces what waited there and can never push out another topic's.
        self._hints: dict[str, bytes] = {}
        self._hint_ready = asyncio.Event()
        self._handled_path = store.root / "handled.json"
        self._handled: list[str] = self._load_handled()
        self._committed_path = store.root / "committed-envelopes.json"
        self._committed: dict[str, str] = self._load_committed()
        self.agent: AgentUpdates | None = None  # agent releases ([updates] agent_root set)
        self.cancels = Cancellations(store.root / "cancelled.json", settings.max_cancellations)

    # --- entry points --------------------------------------------------------------------
    async def on_message(self, topic: str, payload: bytes) -> None:
        """The MQTT handler: trust rotations apply at once, releases queue for the worker."""
        purpose = purpose_of(topic)
        if purpose == "trust":
            self.rotate_trust(payload)
        elif purpose == "release":
            if claimed_kind(payload, self.settings.max_manifest_bytes) == CANCEL:
                self.cancels.receive(payload, self.trust)  # now: the release it covers may wait
                return
            self._hints.pop(topic, None)  # re-insert: the topic moves to the back of the line
            self._hints[topic] = payload
            self._hint_ready.set()
        else:
            log.warning("ignored a message on %s (not a release or trust topic)", topic)

    async def run(self) -> None:
        """Install queued releases one after the other, until cancelled; a canary's verdict
        is awaited outside this loop (``updates.canary``), so it holds no other release."""
        while True:
            await self._hint_ready.wait()
            topic = next(iter(self._hints))
            envelope = self._hints.pop(topic)
            if not self._hints:
                self._hint_ready.clear()
            try:
                await self.apply(envelope, topic, await_canary=False)
            except Exception:  # a bug in one install must not stop later ones
                log.exception("the update worker failed on a release from %s", topic)

    def rotate_trust(self, envelope: bytes) -> None:
        """Apply a trust message (one envelope or a chain) all or nothing, and report it."""
        key = self._handled_key("trust", envelope)
        if key in self._handled:
            return
        release = ReleaseRef("trust", "", f"trust-{key[6:18]}")
        try:  # the store bounds each envelope and the chain itself (max_bytes, MAX_CHAIN)
            self.trust = self.trust.update(envelope)  # one envelope, or a chain to catch up
        except TrustError as exc:
            if exc.code != outcomes.SAME_VERSION:
                self._refused(release, exc)
            return
        release = replace(release, version=str(self.trust.version))
        detail = "trust file rotated"
        for model, version in sorted(self.trust.floor_resets.items()):
            self.store.reset_floor(model, version)
            detail += f"; floor of {model} reset to {version}"
        self.reporter.outcome(release, "succeeded", outcomes.ROTATED, detail)
        self._remember(key)

    async def apply(
        self, envelope: bytes, topic: str = "", *, await_canary: bool = True
    ) -> dict[str, Any] | None:
        """Run one release through every step; return the outcome record (None while the
        re-delivered release is a canary still waiting; a re-send of the committed envelope is
        answered ``same_version``).

        ``topic`` is where it arrived: on a model's retained slot only that model's release is
        taken, so a copy in another model's slot (which would hide that model's release from
        devices joining later) is refused as ``wrong_topic``. Without ``await_canary`` (the
        worker) a canary install returns once the canary takes traffic; its outcome follows.
        A newer release of a model whose canary waits supersedes that canary first.
        """
        key = self._handled_key("release", envelope)
        if key in self._handled:
            return self._resent(envelope, key)
        try:
            self._check_size(envelope)
            if claimed_kind(envelope, self.settings.max_manifest_bytes) == KIND:
                return await self._agent_release(envelope, topic)  # code: its own role
            manifest = self._verify(envelope)
        except TrustError as exc:
            if (
                isinstance(exc, ReleaseRefused)
                and exc.code == outcomes.REPLAY
                and release_model(topic)
            ):
                return self._behind(exc, topic)
            return self._refused(self._describe(envelope, exc), exc)
        slot = release_model(topic)
        if slot is not None and slot != manifest.model:
            refusal = TrustError(
                outcomes.WRONG_TOPIC,
                f"a release of {manifest.model} on the retained slot of {slot} ({topic})",
            )
            return self._refused(manifest.ref(), refusal)
        cancelled = self.cancels.refusal(manifest)
        if cancelled is not None:
            return self._refused(manifest.ref(), cancelled)
        variants = self._variants(manifest)
        if not variants:
            offered = ", ".join(v.key for v in manifest.variants)
            refusal = TrustError(
                outcomes.NO_VARIANT,
                f"{manifest.model} {manifest.version}: none of its variants ({offered}) runs "
                f"on profile {self.device.profile or '?'} with the runtimes installed here",
            )
            return self._refused(manifest.ref(), refusal)
        locked = recipient_refusal(manifest, variants, self.device.device_id)
        if locked is not None:
            return self._refused(manifest.ref(), locked)
        waiting = self.canaries.get(manifest.model)
        if waiting is not None:
            if waiting.key == key:  # its own re-delivery (a reconnect): nothing to do
                return None
            if manifest.serial <= waiting.pending.serial:
                refusal = TrustError(
                    outcomes.CANARY_WAITING,
                    f"serial {manifest.serial} is not above serial {waiting.pending.serial} "
                    f"of {manifest.model} {waiting.pending.version}, whose canary is running",
                )
                return self._refused(manifest.ref(), refusal)
            newer = f"{manifest.model} {manifest.version} (serial {manifest.serial})"
            await self.canaries.supersede(manifest.model, newer)
            # concluded: its verdict may have come first and raised the floor, so verify again
            return await self.apply(envelope, topic, await_canary=await_canary)
        concluding = await self._install(manifest, variants, key)
        if concluding is not None and await_canary:
            await asyncio.shield(concluding)
        return self.reporter.last

    async def _agent_release(self, envelope: bytes, topic: str) -> dict[str, Any]:
        """An agent release (``selfupdate``): on the agent's slot or this device's topic only."""
        slot = release_model(topic)
        if slot is not None and slot != AGENT_SLOT:
            raise TrustError(
                outcomes.WRONG_TOPIC, f"an agent release on the slot of {slot} ({topic})"
            )
        if self.agent is None:
            raise TrustError(outcomes.SELF_UPDATE_OFF, "agent releases need [updates] agent_root")
        return await self.agent.apply(envelope, self.trust)

    async def serves(self, name: str) -> None:
        """A new agent's confirmation of one model that served before its switch: it is
        loaded and passes the update health check (golden inputs)."""
        try:
            model = self.registry.get(name)
        except Exception as exc:
            raise InstallFailed(outcomes.MODEL_NOT_SERVED, f"{name}: {exc}") from exc
        await health_check(model, self.settings.health_timeout_s, self.settings.golden_top_k)

    def ready_models(self) -> list[str]:
        """The models serving now (READY), which a new agent must serve too."""
        index: list[dict[str, str]] = getattr(self.registry, "index", lambda: [])()
        return sorted({row["name"] for row in index if row.get("state") == "READY"})

    def _verify(self, envelope: bytes) -> ReleaseManifest:
        """``verify_release`` against this device's trust, identity, history and limits."""
        return verify_release(
            envelope,
            self.trust,
            device=self.device,
            history=self,
            max_artifact_bytes=self.settings.max_artifact_bytes,
            clock_skew_s=self.settings.clock_skew_s,
        )

    def _resent(self, envelope: bytes, key: str) -> dict[str, Any]:
        """Answer a re-send of the envelope committed here: ``same_version``, nothing reinstalled.

        The hub re-sends the exact bytes after a crash of its own and waits for an answer
        (``same_version`` counts as done), so silence would time its deployment out. The
        answer is an event only (``persist=False``): the retained copy comes again on every
        reconnect, and it must not rewrite the saved history or push the real outcome out of
        the state report. The model, version and deployment are read from the verified
        manifest; bytes no longer trusted (a rotated-away key) get that refusal instead.
        """
        try:
            manifest = self._verify(envelope)
        except ReleaseRefused as exc:  # its own serial is the floor: the expected answer
            manifest = exc.manifest
        except TrustError as exc:
            release = self._describe(envelope, exc)
            return self.reporter.outcome(release, "refused", exc.code, exc.message, persist=False)
        message = (
            f"{manifest.model} {manifest.version} (serial {manifest.serial}): this envelope "
            f"was committed here already ({key[8:20]}); nothing reinstalled"
        )
        release = manifest.ref()
        return self.reporter.outcome(
            release, "refused", outcomes.SAME_VERSION, message, persist=False
        )

    def _behind(self, exc: ReleaseRefused, topic: str) -> dict[str, Any]:
        """Answer a group's retained slot holding a release older than the one committed here
        as ``_resent`` answers the committed one there: an event only. The slot lags behind a
        device the hub server updated on its own topic, and comes again on every reconnect,
        so the answer must not rewrite the saved history or the state report's last outcome
        (what the fleet table shows); the event still tells the hub, as a replay put there
        by someone else must."""
        hint = (
            f"; the slot {topic} lags behind this device: publish a newer release there "
            "(hub publish) or clear it (hub unpublish)"
        )
        release = exc.manifest.ref()
        return self.reporter.outcome(
            release, "refused", exc.code, exc.message + hint, persist=False
        )

    def _variants(self, manifest: ReleaseManifest) -> list[VariantArtifact]:
        """The variants of ``manifest`` this device downloads (its choice, best first)."""
        by_key = {variant.key: variant for variant in manifest.variants}
        return [by_key[key] for key in self.choose_variants(list(by_key)) if key in by_key]

    # --- the release history verify_release checks against (ReleaseHistory) --------------
    def floor(self, model: str) -> str | None:
        """The version floor, which counts only while the model has no serial floor: the
        store's record (a root-signed reset), or — before anything of this model was committed
        here — the version serving now, so a device serving factory seed v5 never accepts an
        old (still unexpired) v2."""
        floor = self.store.floor(model)
        if floor is not None:  # committed here: the store's record is the whole truth (and
            return floor  # a root-signed reset may have lowered it below what serves now)
        try:
            serving: str | None = self.registry.get(model).package.version
        except Exception:  # not loaded (or unknown): only the store's record counts
            serving = None
        return serving if serving is not None and VERSION_RE.match(serving) else None

    def serial_floor(self, model: str) -> int | None:
        return self.store.serial_floor(model)

    def bad_versions(self, model: str) -> set[str]:
        return self.store.bad_versions(model)

    def _check_size(self, envelope: bytes) -> None:
        """Refuse an envelope over ``[updates] max_manifest_bytes`` before reading any of it."""
        limit = self.settings.max_manifest_bytes
        if len(envelope) > limit:
            raise VerificationError(
                outcomes.TOO_LARGE,
                f"envelope: {len(envelope)} bytes is over the limit of {limit} bytes "
                "([updates] max_manifest_bytes)",
            )

    def _refused(self, release: ReleaseRef, exc: TrustError) -> dict[str, Any]:
        """Report a refusal. Nothing is remembered, so it never suppresses a later delivery;
        bytes nobody trusted signing (junk) are not even persisted in the report history."""
        persist = not isinstance(exc, VerificationError) or isinstance(exc, ManifestError)
        return self.reporter.outcome(release, "refused", exc.code, exc.message, persist=persist)

    @staticmethod
    def _describe(envelope: bytes, exc: TrustError) -> ReleaseRef:
        """Model, version and deployment of a refused release, when its signature was good."""
        if isinstance(exc, ReleaseRefused):
            return exc.manifest.ref()
        return ReleaseRef()

    def status(self) -> dict[str, Any]:
        return {
            **self.reporter.status(),
            "queued": len(self._hints),
            "trust_version": self.trust.version,
            "floors": {m: self.floor(m) for m in self.store.models()},
            "serials": {m: self.store.serial_floor(m) for m in self.store.models()},
            "installed": {m: self.store.current(m) for m in self.store.models()},
            "pending": (lambda p: p and {"model": p.model, "version": p.version, "step": p.step})(
                self.store.pending()
            ),
            "canaries": self.canaries.status(),
            "cancellations": self.cancels.status(),
        }

    # --- the steps -----------------------------------------------------------------------
    async def _install(
        self, manifest: ReleaseManifest, variants: list[VariantArtifact], key: str
    ) -> asyncio.Task[None] | None:
        """Run the steps after ``verify``; any failure, expected or not, rolls back.

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
            for artifact in (manifest.artifact, *(v.artifact for v in variants)):
                downloads.append(await self._download(artifact, release))
            shared, *files = downloads
            downloaded = manifest.artifact.size + sum(v.artifact.size for v in variants)
            self.store.advance(pending, "downloaded")
            self.reporter.progress(
                release, "downloaded", bytes=downloaded, variants=[v.key for v in variants]
            )
            checkpoint("downloaded")

            cancelled = self.cancels.refusal(manifest)
            if cancelled is not None:  # it came while this downloaded: the last moment to stop
                raise InstallFailed(cancelled.code, cancelled.message)

            step = "unpack"
            unpacked = await self._unpack(manifest, shared, list(zip(variants, files, strict=True)))
            self.store.advance(pending, "unpacked")
            self.reporter.progress(release, "unpacked")
            checkpoint("unpacked")

            step = "install"
            installed = await asyncio.to_thread(
                self.store.install, manifest.model, manifest.version, unpacked
            )
            self._discard(downloads)
            self.store.advance(pending, "installed")
            self.reporter.progress(release, "installed")
            checkpoint("installed")

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

    async def _golden(self, model: Served) -> None:
        """The golden check within ``health_timeout_s``; InstallFailed when it fails."""
        timeout_s = self.settings.health_timeout_s
        try:
            await asyncio.wait_for(
                health_check(model, timeout_s, self.settings.golden_top_k), timeout_s
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
        self._remember(key)  # a re-delivered envelope is not refused as "same_version"
        self._supersede(pending.model, key)
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

    async def _download(self, artifact: Artifact, release: ReleaseRef | Mapping[str, str]) -> Path:
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
    ) -> Path:
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
            install_wrapped_keys(root, [variant for variant, _ in variants], self.device.device_id)
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
        return root

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
            if bad:
                self.store.mark_bad(model, pending.version)
        finally:  # whatever else failed, the next install must not find this one pending
            self._clear(pending)
        if installed:
            message = f"rolled back: {message}"
            self.reporter.outcome(release, "failed", code, message, details=details)
        else:  # nothing had been installed: the release was refused, the store is as it was
            self.reporter.outcome(release, "refused", code, message, details=details)

    # --- handled envelopes ---------------------------------------------------------------
    @staticmethod
    def _handled_key(purpose: str, envelope: bytes) -> str:
        """Accepted envelopes are remembered per purpose: bytes applied as a trust rotation say
        nothing about the same bytes as a release, and vice versa."""
        return f"{purpose}:{hashlib.sha256(envelope).hexdigest()}"

    def _load_handled(self) -> list[str]:
        try:
            data = json.loads(self._handled_path.read_text(encoding="utf-8"))
            return [str(d) for d in data][-_REMEMBERED:]
        except (OSError, ValueError, TypeError):
            return []

    def _remember(self, key: str) -> None:
        if key in self._handled:
            return
        self._handled = [*self._handled, key][-_REMEMBERED:]
        write_json_atomic(self._handled_path, self._handled)

    def _load_committed(self) -> dict[str, str]:
        try:
            data = json.loads(self._committed_path.read_text(encoding="utf-8"))
            return {str(m): str(k) for m, k in data.items()}
        except (OSError, ValueError, TypeError, AttributeError):
            return {}

    def _supersede(self, model: str, key: str) -> None:
        """Forget the envelope committed before for ``model``: it is a replay now (its serial
        is below the floor), and a replay is refused and reported, not silently skipped."""
        old = self._committed.get(model)
        if old == key:
            return
        if old in self._handled:
            self._handled = [k for k in self._handled if k != old]
            write_json_atomic(self._handled_path, self._handled)
        self._committed[model] = key
        write_json_atomic(self._committed_path, self._committed)


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

        The report is otherwise sent only when something changes, so a quiet, healthy device
        looked as stale to the hub as a dead one whose Last Will was lost, and its temperature
        history had no points between changes. The link keeps only the latest report, so a
        heartbeat while the broker is away costs nothing but the newest copy."""
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
        download=updater._download,
        served_models=updater.ready_models,
        check_model=updater.serves,
        checkpoint=checkpoint,
    )
