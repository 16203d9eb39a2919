"""[governor]: the power and thermal governor."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GovernorSettings:
    enabled: bool = True
    interval_s: float = 1.0
