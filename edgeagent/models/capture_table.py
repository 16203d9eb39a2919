"""``[capture]`` in ``model.toml``: what the package's author says about collecting its inputs.

A package may forbid capture outright (``no_capture = true``: a model that sees faces, a medical
image) — the agent then refuses every frame of it whatever the operator configured — or override
the operator's ``[capture]`` defaults for this model (a confidence band, labels, a sampling
percentage, caps). Only the table's shape is checked here; the agent merges it with its own
``[capture]`` section (``edgeagent.capture.rules``), so an unset key means "the agent's value".
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeagent.models.toml_fields import Fields

# key → (kind, check, what the check says); None = no check beyond the type.
_NUMBERS = {
    "min_confidence": (lambda v: 0.0 <= v <= 1.0, "must be between 0 and 1"),
    "max_confidence": (lambda v: 0.0 <= v <= 1.0, "must be between 0 and 1"),
    "sample_percent": (lambda v: 0.0 <= v <= 100.0, "must be between 0 and 100"),
}
_COUNTS = ("per_minute", "per_hour", "per_day")


@dataclass(frozen=True)
class CaptureHints:
    """The package's ``[capture]`` table; ``overrides`` holds only the keys it set."""

    no_capture: bool = False
    enabled: bool | None = None  # None = the agent's [capture] decides
    overrides: tuple[tuple[str, Any], ...] = ()

    def override(self, key: str, default: Any) -> Any:
        return dict(self.overrides).get(key, default)


def read_capture(manifest: Path, table: dict[str, Any] | None) -> CaptureHints:
    """The checked ``[capture]`` table (empty hints when the package has none)."""
    if table is None:
        return CaptureHints()
    fields = Fields(manifest, "capture", table)
    fields.unknown({"no_capture", "enabled", "labels", *_NUMBERS, *_COUNTS})
    no_capture = fields.get("no_capture", bool, False)
    enabled = fields.get("enabled", bool, None)
    overrides: list[tuple[str, Any]] = []
    for key, (check, problem) in _NUMBERS.items():
        value = fields.get(key, (int, float), None)
        if value is not None:
            if not check(value):
                fields.fail(problem, key)
            overrides.append((key, float(value)))
    for key in _COUNTS:
        value = fields.get(key, int, None)
        if value is not None:
            if value < 0:
                fields.fail("must be 0 or more (0 = no cap)", key)
            overrides.append((key, value))
    labels = fields.get("labels", list, None)
    if labels is not None:
        if not all(isinstance(label, str) for label in labels):
            fields.fail("must be a list of label names", "labels")
        overrides.append(("labels", tuple(labels)))
    band = dict(overrides)
    if band.get("min_confidence", 0.0) > band.get("max_confidence", 1.0):
        fields.fail("min_confidence is above max_confidence", "min_confidence")
    return CaptureHints(no_capture=no_capture, enabled=enabled, overrides=tuple(overrides))
