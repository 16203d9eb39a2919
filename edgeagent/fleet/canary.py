"""A release's ``canary`` table: what the signed manifest asks of the on-device canary.

``canary = {share = 0.1, min_requests = 200, max_error_rate = 0.01, max_p99_ratio = 1.5,
max_seconds = 600}`` — every key optional; one the release leaves out takes the device's
default (``[server] canary_*``, ``[updates] canary_max_seconds``). The bounds are the
engine's (``engine.canary.LIMITS``), so the hub refuses at signing what a device would refuse.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from edgeagent.engine.canary import LIMITS, CanaryPolicy, check_threshold


@dataclass(frozen=True)
class ReleaseCanary:
    """The thresholds a release sets for its canary; None = the device's default."""

    share: float | None = None
    min_requests: int | None = None
    max_error_rate: float | None = None
    max_p99_ratio: float | None = None
    max_seconds: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """Only the keys the release sets (what is signed)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

    def policy(self, defaults: CanaryPolicy) -> CanaryPolicy:
        """The device's defaults with this release's values over them."""
        return dataclasses.replace(defaults, **self.to_dict())

    @classmethod
    def parse(cls, value: Any) -> ReleaseCanary:
        """From the manifest's JSON object; ValueError names the key and the bounds."""
        if not isinstance(value, dict):
            raise ValueError(f"must be an object with any of {', '.join(LIMITS)}")
        checked: dict[str, Any] = {str(k): check_threshold(str(k), v) for k, v in value.items()}
        return cls(**checked)

    @classmethod
    def from_option(cls, text: str) -> ReleaseCanary:
        """From ``hub sign --canary share=0.1,min_requests=200`` ("" = every device default)."""
        values: dict[str, Any] = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            key, sep, raw = part.partition("=")
            key = key.strip()
            if not sep or not raw.strip():
                raise ValueError(f"{part!r} is not KEY=VALUE (keys: {', '.join(LIMITS)})")
            if key in values:
                raise ValueError(f"{key} is given twice")
            try:
                values[key] = int(raw) if key == "min_requests" else float(raw)
            except ValueError:
                raise ValueError(f"{key}: {raw.strip()!r} is not a number") from None
        return cls.parse(values)
