"""What the governor asks of the serving engine: the one value object between the two.

The engine reads the current limits before every batch, so a state change takes effect within
one batch, and nothing in serving needs to know about temperatures or batteries.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServingLimits:
    """Caps the engine must respect now. The defaults mean "no throttling"."""

    max_batch_size: int | None = None  # cap on the batch size; None = the model's own limit
    max_concurrency: int | None = None  # batches running at once across all models
    duty_cycle: float = 1.0  # pacing: the most each device may be busy, a fraction of time
    shed_priority_from: int | None = None  # shed requests whose priority >= this (1 = highest)
    retry_after_s: int = 5  # Retry-After for shed or throttled requests
    pause_downloads: bool = False  # updates wait while this is set
    prefer_low_power: bool = False  # switch to the profile's low-power candidate where one exists
    reason: str = ""  # why, for error messages and status ("hot: tj-thermal 91.2 °C")


UNTHROTTLED = ServingLimits()
