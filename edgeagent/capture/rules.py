"""Which answered requests become samples: the rule of each model and its rate caps.

A model's rule is the agent's ``[capture]`` values with the package's ``[capture]`` table laid
over them. ``Rules.decide`` runs on the event loop for every answered image request, so it
only compares numbers and counts: the band, the labels, a random draw against the sampling
percentage, then the caps. Caps are sliding windows (the last 60 s / hour / day of kept
samples), so no window of that length ever holds more than its cap, wherever it starts.
"""

from __future__ import annotations

import bisect
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from edgeagent.capture.settings import CaptureSettings
from edgeagent.engine.hooks import InferenceEvent
from edgeagent.models.capture_table import CaptureHints

WINDOWS = (("per_minute", 60.0), ("per_hour", 3600.0), ("per_day", 86400.0))

# Why an answer was not kept (the label of the drop counter and of status).
NO_CAPTURE = "no_capture"  # the package forbids it: the whole frame is refused
NOT_SELECTED = "not_selected"  # this model is not in [capture] models
OUT_OF_BAND = "confidence"
OTHER_LABEL = "label"
NOT_SAMPLED = "sampling"


@dataclass(frozen=True)
class Rule:
    """One model's capture rule (agent defaults with the package's overrides)."""

    min_confidence: float
    max_confidence: float
    labels: tuple[str, ...]
    sample_percent: float
    caps: tuple[tuple[str, float, int], ...]  # (name, window seconds, cap); cap 0 = none

    @classmethod
    def of(cls, settings: CaptureSettings, hints: CaptureHints) -> Rule:
        return cls(
            min_confidence=hints.override("min_confidence", settings.min_confidence),
            max_confidence=hints.override("max_confidence", settings.max_confidence),
            labels=tuple(hints.override("labels", tuple(settings.labels))),
            sample_percent=hints.override("sample_percent", settings.sample_percent),
            caps=tuple(
                (name, seconds, int(hints.override(name, getattr(settings, name))))
                for name, seconds in WINDOWS
            ),
        )


@dataclass
class _Kept:
    """When one model's samples were kept (sorted), for its sliding-window caps."""

    times: list[float] = field(default_factory=list)

    def within(self, now: float, seconds: float) -> int:
        return len(self.times) - bisect.bisect_right(self.times, now - seconds)

    def add(self, now: float, horizon: float) -> None:
        self.times.append(now)
        drop = bisect.bisect_right(self.times, now - horizon)
        if drop:
            del self.times[:drop]


class Rules:
    """Decides per answered request: ``None`` = capture it, else the reason it is not kept."""

    def __init__(
        self,
        settings: CaptureSettings,
        *,
        clock: Callable[[], float] = time.monotonic,
        draw: Callable[[], float] = random.random,
    ) -> None:
        self._settings = settings
        self._clock = clock
        self._draw = draw
        self._rules: dict[tuple[str, str], Rule] = {}
        self._kept: dict[str, _Kept] = {}

    def rule(self, model: str, version: str, hints: CaptureHints) -> Rule | str:
        """The model version's rule, or why it is never captured."""
        if hints.no_capture:
            return NO_CAPTURE
        chosen = self._settings.models
        if (chosen and model not in chosen) or hints.enabled is False:
            return NOT_SELECTED
        key = (model, version)
        if key not in self._rules:
            self._rules[key] = Rule.of(self._settings, hints)
        return self._rules[key]

    def decide(self, event: InferenceEvent, hints: CaptureHints) -> str | None:
        rule = self.rule(event.model, event.version, hints)
        if isinstance(rule, str):
            return rule
        if not rule.min_confidence <= event.confidence <= rule.max_confidence:
            return OUT_OF_BAND
        if rule.labels and not set(rule.labels) & set(event.labels):
            return OTHER_LABEL
        if self._draw() * 100.0 >= rule.sample_percent:
            return NOT_SAMPLED
        now = self._clock()
        kept = self._kept.setdefault(event.model, _Kept())
        for name, seconds, cap in rule.caps:
            if cap and kept.within(now, seconds) >= cap:
                return name
        kept.add(now, max(seconds for _, seconds, _ in rule.caps))
        return None
