"""The update service as the daemon runs it: each release routed to its plane (the tensor
registry or the language plane), its variants chosen from this board's profile and what the
probe recently failed, and every swap behind the update gate (locks, maintenance windows).

The daemon passes the parts it built; how they combine into one service is decided here, so the
composition root stays a list of parts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from edgeagent.engine.language.plane import LanguagePlane
from edgeagent.engine.limits import ServingLimits
from edgeagent.engine.planes import Planes, language_variants
from edgeagent.engine.registry import ModelRegistry
from edgeagent.fleet.settings import MqttSettings
from edgeagent.fleet.windows import device_zone
from edgeagent.hardware.choose import release_variants
from edgeagent.hardware.service import Accelerators
from edgeagent.updates.locks import UpdateGate, UpdateLocks
from edgeagent.updates.service import UpdateService
from edgeagent.updates.settings import UpdateSettings


def assemble_updates(
    settings: UpdateSettings,
    mqtt: MqttSettings,
    *,
    state_dir: Path,
    device_id: str,
    registry: ModelRegistry,
    language: LanguagePlane,
    accelerators: Accelerators,
    locks: UpdateLocks,
    metrics: CollectorRegistry,
    limits: Callable[[], ServingLimits],
    sources: Mapping[str, Callable[[], dict[str, Any]]],
) -> UpdateService:
    """The update service over ``registry`` and ``language`` (it recovers a half-done install
    as it is built, so build it before any model loads)."""
    profile = accelerators.profile
    planes = Planes(registry, language)  # each release to its plane

    def choose_variants(available: Sequence[str]) -> list[str]:
        return language_variants(available) or release_variants(
            profile,
            available,
            cpu_fallback=settings.cpu_fallback_variant,
            failed=accelerators.failed_candidates(settings.failed_probe_memory_s),
        )

    return UpdateService(
        settings,
        mqtt,
        state_dir=state_dir,
        device_id=device_id,
        registry=planes,
        metrics=metrics,
        limits=limits,
        sources={**sources, "models": planes.status},
        choose_variants=choose_variants,
        profile=profile.name,
        gate=UpdateGate(locks, device_zone(settings.timezone), settings.window_check_s),
    )
