"""Whether a release is taken: hint → verify → the install steps, one release at a time.

Each received envelope is checked here, in this order, and a refusal changes nothing and is
reported::

    hint        the MQTT handler queues it, newest per topic (``release_memory``); trust
                rotations apply at once, cancellations are held (``cancels``)
    verify      signatures, then manifest (format 2), expiry, target, serial floor, bad list
                (``judge_release``), the retained slot's model, which variants this
                device runs (its profile ranking), and that a sealed one is wrapped for this
                device (``not_a_recipient``); an envelope handled before is answered, not
                reinstalled, and a newer release supersedes a model's waiting canary
    install     the steps after verification, and their rollback (``updates.install``)

The split follows python-tuf's: this module holds the decisions, ``release_memory`` what is
remembered, ``install`` the steps that touch the store and the registry, ``service`` the
daemon's wiring (the MQTT link, recovery, agent self-updates).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from edgeagent.engine.limits import UNTHROTTLED, ServingLimits
from edgeagent.fleet import outcomes
from edgeagent.fleet.agent_manifest import AGENT_SLOT, KIND, claimed_kind
from edgeagent.fleet.cancel import KIND as CANCEL
from edgeagent.fleet.manifest import (
    DeviceIdentity,
    ManifestError,
    ReleaseManifest,
    VariantArtifact,
    judge_release,
)
from edgeagent.fleet.release_ref import ReleaseRef
from edgeagent.fleet.signing import TrustError, VerificationError
from edgeagent.fleet.topics import purpose_of, release_model
from edgeagent.fleet.trust import TrustStore
from edgeagent.fleet.windows import MaintenanceWindow, device_zone
from edgeagent.models.names import VERSION_RE
from edgeagent.selfupdate.service import AgentUpdates
from edgeagent.updates.activation import Activator
from edgeagent.updates.canary_step import WaitingCanaries
from edgeagent.updates.cancels import Cancellations
from edgeagent.updates.errors import InstallFailed
from edgeagent.updates.health import health_check
from edgeagent.updates.install import Installer
from edgeagent.updates.locks import UpdateGate, UpdateLocks
from edgeagent.updates.release_memory import ReleaseMemory, handled_key
from edgeagent.updates.report import UpdateReporter
from edgeagent.updates.settings import UpdateSettings
from edgeagent.updates.store import ModelStore

log = logging.getLogger(__name__)


VariantChoice = Callable[[Sequence[str]], list[str]]
"""Which of a release's variant keys (``runtime/precision``) this device downloads, best
first (``hardware.choose.release_variants`` over the board's profile)."""


@dataclass(frozen=True)
class Arrival:
    """An envelope as ``Updater._read`` found it, read once before any decision: ``apply``
    decides from this alone, so no step goes back to the bytes."""

    key: str  # how the release memory names the envelope (``handled_key``)
    resent: bool  # committed here before: answered, never reinstalled
    agent: bool = False  # claims to be an agent release: ``selfupdate`` verifies it
    manifest: ReleaseManifest | None = None  # authentic: signatures and fields are good
    refusal: TrustError | None = None  # why it may not be taken; None once verified

    def ref(self) -> ReleaseRef:
        """The release as outcomes name it: by its manifest when the signature was good."""
        return self.manifest.ref() if self.manifest is not None else ReleaseRef()


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
        gate: UpdateGate | None = None,
    ) -> None:
        self.settings = settings
        # maintenance windows and update locks (updates.locks); one of its own without a daemon
        self.gate = gate or UpdateGate(
            UpdateLocks(settings.max_lock_hold_s, settings.max_locks),
            device_zone(settings.timezone),
            settings.window_check_s,
        )
        self.choose_variants = choose_variants
        self.store = store
        self.trust = trust
        self.device = device
        self.reporter = reporter
        self.memory = ReleaseMemory(store.root)  # hints waiting, envelopes handled
        self.canaries = WaitingCanaries(store)  # parked installs, their verdicts to come
        self.agent: AgentUpdates | None = None  # agent releases ([updates] agent_root set)
        self.cancels = Cancellations(store.root / "cancelled.json", settings.max_cancellations)
        self.installer = Installer(
            settings=settings,
            store=store,
            registry=registry,
            reporter=reporter,
            memory=self.memory,
            canaries=self.canaries,
            cancels=self.cancels,
            limits=limits,
            before_swap=lambda release: self._defer(release, None),
        )

    @property
    def registry(self) -> Activator:
        """The registry the install steps drive; held once, so replacing it reaches them."""
        return self.installer.registry

    @registry.setter
    def registry(self, registry: Activator) -> None:
        self.installer.registry = registry

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
            self.memory.hint(topic, payload)
        else:
            log.warning("ignored a message on %s (not a release or trust topic)", topic)

    async def run(self) -> None:
        """Install queued releases one after the other, until cancelled; a canary's verdict
        is awaited outside this loop (``updates.canary_step``), so it holds no other release."""
        while True:
            topic, envelope = await self.memory.next_hint()
            try:
                await self.apply(envelope, topic, await_canary=False)
            except Exception:  # a bug in one install must not stop later ones
                log.exception("the update worker failed on a release from %s", topic)

    def rotate_trust(self, envelope: bytes) -> None:
        """Apply a trust message (one envelope or a chain) all or nothing, and report it."""
        key = handled_key("trust", envelope)
        if self.memory.handled(key):
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
        self.memory.remember(key)

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
        arrival = self._read(envelope)
        if arrival.resent:
            return self._resent(arrival)
        if arrival.agent:
            try:
                return await self._agent_release(envelope, topic)  # code: its own role
            except TrustError as exc:
                return self._refused(ReleaseRef(), exc)
        refusal = arrival.refusal
        if refusal is not None:
            if arrival.manifest and refusal.code == outcomes.REPLAY and release_model(topic):
                return self._behind(arrival, topic)
            return self._refused(arrival.ref(), refusal)
        manifest = arrival.manifest
        assert manifest is not None  # no refusal: verified
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
        locked = self._recipient_refusal(manifest, variants)
        if locked is not None:
            return self._refused(manifest.ref(), locked)
        waiting = self.canaries.get(manifest.model)
        if waiting is not None:
            if waiting.key == arrival.key:  # its own re-delivery (a reconnect): nothing to do
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
        await self._defer(manifest.ref(), manifest.window)
        concluding = await self.installer.install(
            manifest, variants, arrival.key, self.device.device_id
        )
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
        await self._defer(ReleaseRef("edgeagent", "", "agent-release"), None)
        return await self.agent.apply(envelope, self.trust)

    async def _defer(self, release: ReleaseRef, window: MaintenanceWindow | None) -> None:
        """Wait for the release's maintenance window and for the update locks; say why."""
        await self.gate.wait(
            window, lambda reason: self.reporter.progress(release, "deferred", reason=reason)
        )

    async def serves(self, name: str) -> None:
        """A new agent's confirmation of one model that served before its switch: it is
        loaded and passes the update health check (golden inputs)."""
        try:
            model = self.registry.get(name)
        except Exception as exc:
            raise InstallFailed(outcomes.MODEL_NOT_SERVED, f"{name}: {exc}") from exc
        settings = self.settings
        await health_check(
            model,
            settings.health_timeout_s,
            settings.golden_top_k,
            settings.llm_tokens_per_second_floor,
        )

    def ready_models(self) -> list[str]:
        """The models serving now (READY), which a new agent must serve too."""
        index: list[dict[str, str]] = getattr(self.registry, "index", lambda: [])()
        return sorted({row["name"] for row in index if row.get("state") == "READY"})

    def _read(self, envelope: bytes) -> Arrival:
        """Read ``envelope`` once, in the order the module docstring gives: is it news (the
        release memory), its size, the kind it claims, its signatures (``TrustStore.verify``),
        then ``judge_release`` against this device's trust, identity, history and limits.
        Never raises a ``TrustError``: a refusal is part of the arrival, for ``apply``.

        A re-sent envelope (committed here before) skips the size and kind checks it passed
        when it was committed, and is verified only to be answered by name."""
        key = handled_key("release", envelope)
        resent = self.memory.handled(key)
        limit = self.settings.max_manifest_bytes
        if not resent and len(envelope) > limit:
            too_large = VerificationError(
                outcomes.TOO_LARGE,
                f"envelope: {len(envelope)} bytes is over the limit of {limit} bytes "
                "([updates] max_manifest_bytes)",
            )
            return Arrival(key, resent, refusal=too_large)
        if not resent and claimed_kind(envelope, limit) == KIND:
            return Arrival(key, resent, agent=True)
        try:
            payload = self.trust.verify(envelope, "release")
            manifest, refusal = judge_release(
                payload,
                self.trust,
                device=self.device,
                history=self,
                max_artifact_bytes=self.settings.max_artifact_bytes,
                clock_skew_s=self.settings.clock_skew_s,
            )
        except TrustError as exc:  # not authentic, or no valid manifest
            return Arrival(key, resent, refusal=exc)
        return Arrival(key, resent, manifest=manifest, refusal=refusal)

    def _resent(self, arrival: Arrival) -> dict[str, Any]:
        """Answer a re-send of the envelope committed here: ``same_version``, nothing reinstalled.

        The hub re-sends the exact bytes after a crash of its own and waits for an answer
        (``same_version`` counts as done), so silence would time its deployment out. The
        answer is an event only (``persist=False``): the retained copy comes again on every
        reconnect, and it must not rewrite the saved history or push the real outcome out of
        the state report. The model, version and deployment are read from the verified
        manifest (its own serial is the floor now, so the refusal carrying it is the expected
        answer); bytes no longer trusted (a rotated-away key) get that refusal instead.
        """
        manifest, refusal = arrival.manifest, arrival.refusal
        if manifest is None and refusal is not None:
            return self.reporter.outcome(
                ReleaseRef(), "refused", refusal.code, refusal.message, persist=False
            )
        assert manifest is not None  # an arrival carries a manifest, a refusal or both
        message = (
            f"{manifest.model} {manifest.version} (serial {manifest.serial}): this envelope "
            f"was committed here already ({arrival.key[8:20]}); nothing reinstalled"
        )
        return self.reporter.outcome(
            manifest.ref(), "refused", outcomes.SAME_VERSION, message, persist=False
        )

    def _behind(self, arrival: Arrival, topic: str) -> dict[str, Any]:
        """Answer a group's retained slot holding a release older than the one committed here
        as ``_resent`` answers the committed one there: an event only. The slot lags behind a
        device the hub server updated on its own topic, and comes again on every reconnect,
        so the answer must not rewrite the saved history or the state report's last outcome
        (what the fleet table shows); the event still tells the hub, as a replay put there
        by someone else must."""
        refusal = arrival.refusal
        assert refusal is not None
        hint = (
            f"; the slot {topic} lags behind this device: publish a newer release there "
            "(hub publish) or clear it (hub unpublish)"
        )
        return self.reporter.outcome(
            arrival.ref(), "refused", refusal.code, refusal.message + hint, persist=False
        )

    def _variants(self, manifest: ReleaseManifest) -> list[VariantArtifact]:
        """The variants of ``manifest`` this device downloads (its choice, best first)."""
        by_key = {variant.key: variant for variant in manifest.variants}
        return [by_key[key] for key in self.choose_variants(list(by_key)) if key in by_key]

    def _recipient_refusal(
        self, manifest: ReleaseManifest, variants: Sequence[VariantArtifact]
    ) -> TrustError | None:
        """``not_a_recipient`` when a chosen variant is sealed but not for this device: the
        signed manifest must wrap its content key for this device id (``updates.wrapped_keys``
        installs it beside the ciphertext)."""
        device_id = self.device.device_id
        locked = [
            v.key
            for v in variants
            if v.encryption is not None and v.encryption.wrapped_for(device_id) is None
        ]
        if not locked:
            return None
        return TrustError(
            outcomes.NOT_A_RECIPIENT,
            f"{manifest.model} {manifest.version}: variant(s) {', '.join(locked)} are encrypted, "
            f"and no content key is wrapped for device {device_id!r} (the hub must collect its "
            "public key and sign the release with it among the --recipients)",
        )

    # --- the release history judge_release checks against (ReleaseHistory) ---------------
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

    def _refused(self, release: ReleaseRef, exc: TrustError) -> dict[str, Any]:
        """Report a refusal. Nothing is remembered, so it never suppresses a later delivery;
        bytes nobody trusted signing (junk) are not even persisted in the report history."""
        persist = not isinstance(exc, VerificationError) or isinstance(exc, ManifestError)
        return self.reporter.outcome(release, "refused", exc.code, exc.message, persist=persist)

    def status(self) -> dict[str, Any]:
        return {
            **self.reporter.status(),
            "queued": self.memory.queued,
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
