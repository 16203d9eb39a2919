"""The updater's canary step: a release that asks for a canary is judged on live traffic.

Instead of a hot swap, the installed release is loaded *beside* the serving one (memory
checked first), golden-checked before any client reaches it, then given its share of the
traffic until the registry's verdict (``engine.canary_judge``). Promoted, the install goes on to
commit; rolled back, it fails with ``canary_failed`` and the figures, and the release is
marked bad. Progress goes out as ``canary`` (started) and ``canary_promoted`` /
``canary_rolled_back`` / ``canary_interrupted`` events with the deployment id.

This module connects the two halves: the release's table and its bounds (``fleet.release_canary``,
the policy) over the device's defaults, handed to the engine that measures.

The wait for a verdict can last as long as the release's ``max_seconds`` (up to a week), so
it never holds the update worker: once the canary takes traffic its install is *parked*
(``WaitingCanaries``), one per model, and the worker goes on with other releases. A newer
release of the same model supersedes the waiting canary: it is concluded at once
(``canary_superseded``, never committed, not marked bad) before the new release proceeds.
A parked install is recorded in ``store/canaries.json`` beside the store's own
``pending.json``, so a restart rolls it back exactly as ``recover()`` rolls back a canary.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from edgeagent.engine.canary_judge import INTERRUPTED, PROMOTED, Canary, CanaryPolicy, CanaryVerdict
from edgeagent.fleet import outcomes
from edgeagent.fleet.manifest import VariantArtifact
from edgeagent.fleet.release_canary import ReleaseCanary
from edgeagent.fleet.release_ref import ReleaseRef
from edgeagent.fsutil import write_json_atomic
from edgeagent.updates.errors import InstallFailed
from edgeagent.updates.memory import memory_shortfall
from edgeagent.updates.report import UpdateReporter
from edgeagent.updates.settings import UpdateSettings
from edgeagent.updates.store import ModelStore, PendingInstall, Recovery, StoreError

PARKED = "canaries.json"  # in the store's root, beside pending.json


class CanaryRegistry(Protocol):
    """The part of ModelRegistry a canary install drives."""

    def canary_policy(self, **overrides: Any) -> CanaryPolicy: ...

    async def canary(
        self, package_dir: Path, policy: CanaryPolicy | None = None, *, check: Any = None
    ) -> Canary: ...


class CanaryStage:
    """Memory check, canary load with the golden check, and the verdict of one install."""

    def __init__(
        self,
        settings: UpdateSettings,
        registry: CanaryRegistry,
        reporter: UpdateReporter,
        golden: Callable[[Any], Awaitable[None]],
    ) -> None:
        self.settings = settings
        self.registry = registry
        self.reporter = reporter
        self.golden = golden  # raises InstallFailed (health_check_failed) for a bad answer

    def prepare(
        self, requested: ReleaseCanary, variants: Sequence[VariantArtifact]
    ) -> CanaryPolicy:
        """The canary's policy — [server] and [updates] canary_* defaults under the release's
        own values — once the memory check passed (else ``insufficient_memory``)."""
        problem = memory_shortfall(
            max((v.artifact.size for v in variants), default=0),
            factor=self.settings.canary_memory_factor,
            min_free_bytes=self.settings.canary_min_free_bytes,
        )
        if problem:
            raise InstallFailed(outcomes.INSUFFICIENT_MEMORY, problem)
        golden = self.settings.canary_without_traffic == "golden"
        defaults = self.registry.canary_policy(
            max_seconds=self.settings.canary_max_seconds,
            without_traffic="promote" if golden else "rollback",
        )
        return dataclasses.replace(defaults, **requested.to_dict())

    async def start(self, installed: Path, policy: CanaryPolicy, release: ReleaseRef) -> Canary:
        """Load beside the serving version and golden-check; the canary takes traffic when
        this returns. InstallFailed (``load_failed``, or the golden check's) otherwise."""
        timeout_s = self.settings.health_timeout_s
        try:
            canary = await asyncio.wait_for(
                self.registry.canary(installed, policy, check=self.golden), timeout_s
            )
        except InstallFailed:
            raise
        except asyncio.TimeoutError as exc:
            message = f"loading and checking took over {timeout_s} s"
            raise InstallFailed(outcomes.LOAD_FAILED, message, bad=True) from exc
        except Exception as exc:
            raise InstallFailed(outcomes.LOAD_FAILED, str(exc), bad=True) from exc
        self.reporter.progress(
            release,
            "canary",
            share=policy.share,
            min_requests=policy.min_requests,
            max_error_rate=policy.max_error_rate,
            max_p99_ratio=policy.max_p99_ratio,
            max_seconds=policy.max_seconds,
        )
        return canary

    async def verdict(self, waiting: WaitingCanary) -> CanaryVerdict:
        """Await the verdict; returns a promoted one or raises InstallFailed
        (``canary_failed``, ``canary_interrupted``, or ``canary_superseded`` when a newer
        release ended it)."""
        verdict = await waiting.canary.outcome()
        release = waiting.release
        figures = verdict.figures()
        self.reporter.progress(release, f"canary_{verdict.outcome}", **figures)
        if verdict.outcome == PROMOTED:
            return verdict
        details = {"canary": figures}
        if verdict.outcome == INTERRUPTED:
            code = (
                outcomes.CANARY_SUPERSEDED if waiting.superseded_by else outcomes.CANARY_INTERRUPTED
            )
            raise InstallFailed(code, verdict.reason, details=details)
        message = f"canary rolled back: {verdict.reason}; {verdict.summary()}"
        raise InstallFailed(outcomes.CANARY_FAILED, message, bad=True, details=details)


@dataclass
class WaitingCanary:
    """One parked install: its canary takes traffic, ``task`` concludes it on the verdict."""

    pending: PendingInstall
    release: ReleaseRef
    key: str  # the envelope's handled key: a re-delivery of the same bytes changes nothing
    canary: Canary
    task: asyncio.Task[None] | None = None
    superseded_by: str = ""  # the release that ended it, when one did


class WaitingCanaries:
    """The parked canary installs, at most one per model, and their durable record."""

    def __init__(self, store: ModelStore) -> None:
        self.store = store
        self.path = store.root / PARKED
        self._waiting: dict[str, WaitingCanary] = {}

    def park(self, waiting: WaitingCanary) -> None:
        """Move the install's record from ``pending.json`` to ``canaries.json`` (record first,
        so a crash between the two leaves it in both, never in neither)."""
        self._waiting[waiting.pending.model] = waiting
        self._write()
        self.store.clear_pending()

    def get(self, model: str) -> WaitingCanary | None:
        return self._waiting.get(model)

    def finish(self, pending: PendingInstall) -> bool:
        """Drop the record of a concluded parked install; False when ``pending`` is not one
        (its record is the store's ``pending.json``)."""
        waiting = self._waiting.get(pending.model)
        if waiting is None or waiting.pending is not pending:
            return False
        del self._waiting[pending.model]
        self._write()
        return True

    async def supersede(self, model: str, by: str) -> None:
        """End ``model``'s waiting canary now and wait until its install is rolled back
        (or committed, when its verdict came first)."""
        waiting = self._waiting.get(model)
        if waiting is None:
            return
        if not waiting.canary.done:
            waiting.superseded_by = by
            waiting.canary.end(f"superseded by {by}")
        if waiting.task is not None:
            await asyncio.shield(waiting.task)

    def status(self) -> dict[str, str]:
        """{model: version} of the canaries waiting for a verdict."""
        return {model: w.pending.version for model, w in sorted(self._waiting.items())}

    def tasks(self) -> list[asyncio.Task[None]]:
        return [w.task for w in self._waiting.values() if w.task is not None]

    def _write(self) -> None:
        records = {model: asdict(w.pending) for model, w in self._waiting.items()}
        write_json_atomic(self.path, records)


def recover_parked(store: ModelStore, settled: PendingInstall | None) -> list[Recovery]:
    """Roll back every install a crash left parked, with the store's own ``recover()`` (one
    at a time through ``pending.json``): its canary had no verdict, so it was never committed.
    ``settled`` is the record ``recover()`` already handled, when the crash came between the
    two writes of ``WaitingCanaries.park``. Call it right after ``store.recover()``."""
    path = store.root / PARKED
    done = None if settled is None else (settled.model, settled.version)
    recoveries = []
    for pending in _read_parked(path):
        if (pending.model, pending.version) == done:
            continue
        store.begin(pending)
        recovery = store.recover()
        if recovery is not None:
            recoveries.append(recovery)
    path.unlink(missing_ok=True)
    return recoveries


def _read_parked(path: Path) -> list[PendingInstall]:
    """The parked records left on disk; a corrupt file stops the start as a corrupt
    ``pending.json`` does (nobody can know what to undo)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return [PendingInstall(**record) for record in data.values()]
    except FileNotFoundError:
        return []
    except (ValueError, AttributeError, TypeError) as exc:
        raise StoreError(f"{path}: corrupt store record ({exc}); restore it or delete it") from exc
