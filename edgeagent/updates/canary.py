"""The updater's canary step: a release that asks for a canary is judged on live traffic.

Instead of a hot swap, the installed release is loaded *beside* the serving one (memory
checked first), golden-checked before any client reaches it, then given its share of the
traffic until the registry's verdict (``engine.canary``). Promoted, the install goes on to
commit; rolled back, it fails with ``canary_failed`` and the figures, and the release is
marked bad. Progress goes out as ``canary`` (started) and ``canary_promoted`` /
``canary_rolled_back`` / ``canary_interrupted`` events with the deployment id.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from edgeagent.engine.canary import INTERRUPTED, PROMOTED, Canary, CanaryPolicy, CanaryVerdict
from edgeagent.fleet.canary import ReleaseCanary
from edgeagent.fleet.manifest import VariantArtifact
from edgeagent.updates.errors import InstallFailed
from edgeagent.updates.memory import memory_shortfall
from edgeagent.updates.report import UpdateReporter
from edgeagent.updates.settings import UpdateSettings


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
            raise InstallFailed("insufficient_memory", problem)
        golden = self.settings.canary_without_traffic == "golden"
        defaults = self.registry.canary_policy(
            max_seconds=self.settings.canary_max_seconds,
            without_traffic="promote" if golden else "rollback",
        )
        return requested.policy(defaults)

    async def run(
        self, installed: Path, policy: CanaryPolicy, release: Mapping[str, str]
    ) -> CanaryVerdict:
        """Load, check and judge; returns a promoted verdict or raises InstallFailed."""
        timeout_s = self.settings.health_timeout_s
        try:
            canary = await asyncio.wait_for(
                self.registry.canary(installed, policy, check=self.golden), timeout_s
            )
        except InstallFailed:
            raise
        except asyncio.TimeoutError as exc:
            message = f"loading and checking took over {timeout_s} s"
            raise InstallFailed("load_failed", message, bad=True) from exc
        except Exception as exc:
            raise InstallFailed("load_failed", str(exc), bad=True) from exc
        self.reporter.progress(
            release,
            "canary",
            share=policy.share,
            min_requests=policy.min_requests,
            max_error_rate=policy.max_error_rate,
            max_p99_ratio=policy.max_p99_ratio,
            max_seconds=policy.max_seconds,
        )
        verdict = await canary.outcome()
        figures = verdict.figures()
        self.reporter.progress(release, f"canary_{verdict.outcome}", **figures)
        if verdict.outcome == PROMOTED:
            return verdict
        details = {"canary": figures}
        if verdict.outcome == INTERRUPTED:
            raise InstallFailed("canary_interrupted", verdict.reason, details=details)
        message = f"canary rolled back: {verdict.reason}; {verdict.summary()}"
        raise InstallFailed("canary_failed", message, bad=True, details=details)
