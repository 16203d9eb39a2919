"""A release's ``canary`` table: what the signed manifest asks of the on-device canary.

``canary = {share = 0.1, min_requests = 200, max_error_rate = 0.01, max_p99_ratio = 1.5,
max_seconds = 600}`` — every key optional; one the release leaves out takes the device's
default (``[server] canary_*``, ``[updates] canary_max_seconds``).

This is the policy half of the canary and a leaf: the bounds and the parsing, with no engine
import, so the hub refuses at signing exactly what a device would refuse without loading the
serving engine (numpy, prometheus) to sign a release. The measuring half — routing the share,
the verdict — is ``engine.canary_judge``; ``updates.canary_step`` connects the two on the device.

The bounds keep every canary finite and meaningful: at least one request in a thousand
(below that the share rounds to no traffic at all), at most a million requests, at most a
week. Every number must be a finite JSON number (a bool, ``1e400`` or ``10**400`` is refused
naming the key), so a signed table can never crash the parser or hold a device forever.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

# Bounds of each threshold, (low, high) inclusive. A share over one half would make the
# canary the main version before it was judged.
LIMITS: dict[str, tuple[float, float]] = {
    "share": (0.001, 0.5),
    "min_requests": (1, 1_000_000),
    "max_error_rate": (0.0, 1.0),
    "max_p99_ratio": (1.0, 100.0),
    "max_seconds": (1.0, 7 * 86400.0),
}
INTEGER_FIELDS = frozenset({"min_requests"})


def check_threshold(key: str, value: Any) -> float | int:
    """``value`` for canary threshold ``key`` if it is the right type, finite and within
    LIMITS; else ValueError naming the key, the value and the bounds."""
    if key not in LIMITS:
        raise ValueError(f"unknown canary setting {key!r} (known: {', '.join(LIMITS)})")
    low, high = LIMITS[key]
    integer = key in INTEGER_FIELDS
    wrong_kind = not isinstance(value, int) if integer else not isinstance(value, (int, float))
    if isinstance(value, bool) or wrong_kind:
        kind = "an integer" if integer else "a number"
        raise ValueError(f"canary {key}: must be {kind}, got {_shown(value)}")
    number: int | float = value if integer else _finite(value)
    if not (isinstance(number, int) or math.isfinite(number)) or not low <= number <= high:
        raise ValueError(
            f"canary {key}: {_shown(value)} is not within {_bound(low)}..{_bound(high)}"
        )
    return number


def _finite(value: int | float) -> float:
    """``value`` as a float; an integer too large for one (``10**400``) becomes infinity,
    which the bounds then refuse, instead of an OverflowError nobody catches."""
    try:
        return float(value)
    except OverflowError:
        return math.inf


def _bound(limit: float) -> str:
    """A bound as people write it: ``1000000``, ``604800``, ``0.001``."""
    return str(int(limit)) if limit == int(limit) else f"{limit:g}"


def _shown(value: Any) -> str:
    """The value for a message, cut short (an integer of 400 digits is not a message)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


@dataclass(frozen=True)
class ReleaseCanary:
    """The thresholds a release sets for its canary; None = the device's default."""

    share: float | None = None
    min_requests: int | None = None
    max_error_rate: float | None = None
    max_p99_ratio: float | None = None
    max_seconds: float | None = None

    def to_dict(self) -> dict[str, Any]:
        """Only the keys the release sets (what is signed, and what overrides the defaults)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if v is not None}

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
                values[key] = int(raw) if key in INTEGER_FIELDS else float(raw)
            except ValueError:
                raise ValueError(f"{key}: {_shown(raw.strip())} is not a number") from None
        return cls.parse(values)
