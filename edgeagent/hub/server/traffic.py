"""Each model's throughput, error rate and latency over time, from a device's state history.

A state report carries counters — requests and failed requests since the active version loaded
— and the latency of the newest answers (``fleet.messages.Traffic``); the hub keeps them in each
state row of the history (``reports.state_columns``). A rate is the difference of two successive
rows' counters over the time between them on the device's clock (the hub's when a row lacks
it). Where no figure would be honest, the series has a gap (``None``) rather than an invented
point: the first row, a version change or a counter that went down (the agent restarted), no
time between the two, and — for the error share and the latency — an interval without requests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Point = tuple[float, float | None]  # (hub time, value); None: a gap in the line


@dataclass(frozen=True)
class ModelSeries:
    """One model's figures at each state row (the same times in every list)."""

    throughput: list[Point] = field(default_factory=list)  # requests per second
    error_pct: list[Point] = field(default_factory=list)  # failed requests, % of requests
    p50_ms: list[Point] = field(default_factory=list)
    p95_ms: list[Point] = field(default_factory=list)

    def newest(self, count: int) -> ModelSeries:
        """The newest ``count`` points of each figure."""
        return ModelSeries(
            self.throughput[-count:],
            self.error_pct[-count:],
            self.p50_ms[-count:],
            self.p95_ms[-count:],
        )

    def latest(self, name: str) -> float | None:
        """The newest figure of ``name`` (a field above), None when its last row is a gap."""
        points: list[Point] = getattr(self, name)
        return points[-1][1] if points else None


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _figure(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _counters(figures: Mapping[str, Any]) -> tuple[float, float] | None:
    requests, errors = _figure(figures.get("requests")), _figure(figures.get("errors"))
    return None if requests is None or errors is None else (requests, errors)


Figures = tuple[float | None, float | None, float | None, float | None]
GAP: Figures = (None, None, None, None)


def _interval(before: Mapping[str, Any], after: Mapping[str, Any], name: str) -> Figures:
    """(throughput, error %, p50, p95) of ``name`` between two state rows' details."""
    new = _mapping(_mapping(after.get("traffic")).get(name))
    old_counts = _counters(_mapping(_mapping(before.get("traffic")).get(name)))
    new_counts = _counters(new)
    if old_counts is None or new_counts is None:
        return GAP
    if _mapping(before.get("models")).get(name) != _mapping(after.get("models")).get(name):
        return GAP  # another version: its counters started again
    requests, errors = new_counts[0] - old_counts[0], new_counts[1] - old_counts[1]
    seconds = _seconds(before, after)
    if requests < 0 or errors < 0 or seconds is None:
        return GAP  # a restart reset the counters
    if not requests:
        return 0.0, None, None, None
    return (
        requests / seconds,
        100.0 * min(errors, requests) / requests,
        _figure(new.get("p50_ms")),
        _figure(new.get("p95_ms")),
    )


def _seconds(before: Mapping[str, Any], after: Mapping[str, Any]) -> float | None:
    """The time between two rows: the device's clock, else the hub's; None if not positive."""
    device = _figure(before.get("reported_at")), _figure(after.get("reported_at"))
    hub = _figure(before.get("at")), _figure(after.get("at"))
    start, end = device if None not in device else hub
    if start is None or end is None or end <= start:
        return None
    return end - start


def model_series(rows: Sequence[Mapping[str, Any]]) -> dict[str, ModelSeries]:
    """Every model's series from state rows (``{"at": hub time, "detail": summary}``, oldest
    first); a model absent from a row has a gap there."""
    details = [{**_mapping(row.get("detail")), "at": row.get("at")} for row in rows]
    names = sorted({name for d in details for name in _mapping(d.get("traffic"))})
    found = {name: ModelSeries() for name in names}
    for index, detail in enumerate(details):
        at = _figure(detail["at"])
        if at is None:
            continue
        for name, series in found.items():
            figures = _interval(details[index - 1], detail, name) if index else GAP
            for points, value in zip(
                (series.throughput, series.error_pct, series.p50_ms, series.p95_ms),
                figures,
                strict=True,
            ):
                points.append((at, value))
    return found
