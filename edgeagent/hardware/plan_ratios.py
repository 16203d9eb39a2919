"""The plan search's comparison of shapes: paired ratios to a reference shape, and their median.

Apart from the search (``plan_search``) because it is the statistics alone, with no session and
no clock: what makes a measurement on a drifting machine trustworthy, read and tested on its
own numbers.
"""

from __future__ import annotations

import statistics

from edgeagent.hardware.plan_shape import PlanShape

AGREE = 0.2  # two reference windows this close measured the same machine speed


class Sandwiches:
    """Each shape's throughput over a reference shape's, measured just before and just after it.

    A window of a shape sits between two windows of the reference, tens of milliseconds apart:
    a machine whose speed drifts by 2-4× over seconds (other work coming and going) changes
    both sides of the ratio alike. The median of a shape's ratios then drops the windows that
    a burst of other work hit on the shape's side only. (Simulated with bursts that slow a third
    of the time to 0.4×, this picks a shape within 5 % of the best every time; the mean of the
    two neighbours with the median, about half the time.)
    """

    def __init__(self, reference: PlanShape) -> None:
        self.reference = reference
        self.references: list[float] = []  # the reference's own rows/s, every window
        self.ratios: dict[PlanShape, list[float]] = {}

    def add(self, shape: PlanShape, rate: float, before: float, after: float) -> None:
        """One window of ``shape`` between two of the reference: its ratio to their mean where
        they agree (a steady drift cancels), else to the faster (other work only ever slows a
        window down, so a burst hit the slower one; it must not inflate the ratio)."""
        low, high = sorted((before, after))
        reference = (low + high) / 2 if low >= high * (1 - AGREE) else high
        self.ratios.setdefault(shape, []).append(rate / reference if reference > 0 else 0.0)

    def count(self, shape: PlanShape) -> int:
        """Windows measured: the reference's own, or the ratios of another shape."""
        if shape == self.reference:
            return len(self.references)
        return len(self.ratios.get(shape, []))

    def ratio(self, shape: PlanShape) -> float:
        """``shape``'s median throughput over the reference's (1 for the reference itself)."""
        if shape == self.reference:
            return 1.0
        ratios = self.ratios.get(shape)
        return statistics.median(ratios) if ratios else 0.0

    def spread(self, shape: PlanShape) -> float:
        return 0.0 if shape == self.reference else spread_of(self.ratios.get(shape, []))

    def figure(self, shape: PlanShape) -> float:
        """``shape``'s rows/s on the reference's scale (the reference's median × the ratio)."""
        return statistics.median(self.references) * self.ratio(shape) if self.references else 0.0


def spread_of(values: list[float]) -> float:
    """How far a shape's rounds disagree: (max − min) / median."""
    if len(values) < 2:
        return 0.0
    middle = statistics.median(values)
    return (max(values) - min(values)) / middle if middle > 0 else 0.0
