"""A package's ``[serving]`` table: the per-model serving defaults (batch size, queue delay,
cache, execution plan, spread over devices, whether it may go to a peer) that the daemon
config may override.

Apart from the package reader because these are the engine's knobs, not the package's content:
``hardware.settings`` checks ``[hardware] spread`` with the same ``spread_problem``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from edgeagent.models.toml_fields import Fields


@dataclass(frozen=True)
class ServingHints:
    """Per-model serving defaults; the daemon config may override them."""

    max_batch_size: int = 8
    max_queue_delay_ms: float = 2.0
    cache_size: int = 0  # result-cache entries; 0 disables the cache
    # The execution plan (edgeagent.engine.plan): "auto" measures instances × threads × batch
    # on the device; "fixed" serves instances × threads with max_batch_size as given.
    plan: str = "auto"
    instances: int | None = None  # execution instances (sessions); None = the plan's choice
    threads: int | None = None  # intra-op threads per instance; None = the plan's choice
    # Devices serving the model at once (hardware.spread): up to N, or those named; None =
    # [hardware] spread.
    spread: int | tuple[str, ...] | None = None
    # True: never sent to a peer (hardware.peers); a sealed model never is, whatever this says.
    local_only: bool = False


MAX_SPREAD = 16  # devices one model may be spread over


def spread_problem(value: int | Sequence[str]) -> str:
    """Why a ``spread`` value (a device count, or device names) is unusable; "" when fine."""
    if isinstance(value, bool):
        return "must be a number of devices or a list of device names, not true/false"
    if isinstance(value, int):
        return "" if 1 <= value <= MAX_SPREAD else f"must be between 1 and {MAX_SPREAD} devices"
    if not value or len(value) > MAX_SPREAD:
        return f"must name between 1 and {MAX_SPREAD} devices"
    if not all(isinstance(name, str) and name.strip() for name in value):
        return "device names must be non-empty strings (CPU, GPU0, NPU …)"
    if len(set(value)) != len(value):
        return "names a device twice"
    return ""


def read_serving(manifest: Path, table: dict) -> ServingHints:
    fields = Fields(manifest, "serving", table)
    fields.unknown(
        {
            "max_batch_size",
            "max_queue_delay_ms",
            "cache_size",
            "plan",
            "instances",
            "threads",
            "spread",
            "local_only",
        }
    )
    spread = fields.get("spread", (int, list), None)
    if spread is not None and spread_problem(spread):
        fields.fail(spread_problem(spread), "spread")
    hints = ServingHints(
        max_batch_size=fields.get("max_batch_size", int, 8),
        max_queue_delay_ms=float(fields.get("max_queue_delay_ms", (int, float), 2.0)),
        cache_size=fields.get("cache_size", int, 0),
        plan=fields.get("plan", str, "auto", choices=("auto", "fixed")),
        instances=fields.get("instances", int, None),
        threads=fields.get("threads", int, None),
        spread=tuple(spread) if isinstance(spread, list) else spread,
        local_only=fields.get("local_only", bool, False),
    )
    for key in ("instances", "threads"):
        if getattr(hints, key) is not None and not 1 <= getattr(hints, key) <= 256:
            fields.fail("must be between 1 and 256", key)
    if hints.max_batch_size < 1:
        fields.fail("must be at least 1", "max_batch_size")
    if hints.max_queue_delay_ms < 0 or hints.cache_size < 0:
        fields.fail("must not be negative", "max_queue_delay_ms")
    return hints
