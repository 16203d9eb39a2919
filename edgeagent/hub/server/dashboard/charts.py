"""Line charts of figures over time as inline SVG, drawn on the server: no script, no assets.

One drawing for every chart of the dashboard (temperature, throughput, error rate, latency):
each series is a list of ``(time, value)`` points, oldest first, where ``None`` is a gap that
breaks the line, so an interval without an honest figure is never bridged by a made-up slope.
Colours are SVG attributes, not ``style=`` (the pages' Content-Security-Policy allows no inline
style).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from edgeagent.hub.server.dashboard.markup import escape

PALETTE = ("#1a73e8", "#e37400", "#17803d", "#8e24aa", "#00838f", "#5f6368")
LEGEND_ROW = 16  # px per legend row under the plot
LEGEND_ITEM = 200  # px per legend entry in a row
AXIS_ROW = 14  # px for the time labels under the plot


@dataclass(frozen=True)
class Series:
    """One line: its legend label ("" for a chart of one line), points, colour and dash."""

    label: str
    points: Sequence[tuple[float, float | None]]
    colour: str = ""  # "" takes the palette's next
    dashed: bool = False


def figure(value: float) -> str:
    """A value as an axis label: three significant digits, whole numbers from 100 up."""
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _clock(at: float, other: float) -> str:
    """A time label: the clock, with the day when the chart spans more than one."""
    day = time.strftime("%Y-%m-%d", time.localtime(at)) != time.strftime(
        "%Y-%m-%d", time.localtime(other)
    )
    return time.strftime("%m-%d %H:%M" if day else "%H:%M", time.localtime(at))


def _segments(points: Sequence[tuple[float, float | None]]) -> list[list[tuple[float, float]]]:
    """The unbroken runs of a series, split at its gaps."""
    runs: list[list[tuple[float, float]]] = [[]]
    for at, value in points:
        if value is None:
            if runs[-1]:
                runs.append([])
        else:
            runs[-1].append((at, value))
    return [run for run in runs if run]


def line_chart(
    chart_id: str,
    series: Sequence[Series],
    unit: str,
    what: str,
    *,
    from_zero: bool = False,
    width: int = 600,
    height: int = 120,
) -> str:
    """An SVG of ``series`` (newest right), labelled with its range in ``unit`` and its first
    and last times; a note instead when fewer than two points have a value.

    ``from_zero`` for amounts (rates, shares, latency), whose baseline is zero; otherwise the
    axis spans the values with a margin (a temperature's swing would be flat from zero).
    """
    known = [(at, v) for s in series for at, v in s.points if v is not None]
    if len({at for at, _ in known}) < 2:
        note = f"Not enough {escape(what)} samples for a chart yet."
        return f"<p class='muted' id='{chart_id}-empty'>{note}</p>"
    times = [at for at, _ in known]
    values = [v for _, v in known]
    t0, t1 = min(times), max(times)
    low, high = min(values), max(values)
    if from_zero:
        low, high = min(low, 0.0), (high * 1.1 if high > 0 else 1.0)
    else:
        margin = max(1.0, (high - low) * 0.1)
        low, high = low - margin, high + margin

    def xy(at: float, value: float) -> tuple[str, str]:
        x = (at - t0) / (t1 - t0) * width
        return f"{x:.1f}", f"{height - (value - low) / (high - low) * height:.1f}"

    colours = [s.colour or PALETTE[i % len(PALETTE)] for i, s in enumerate(series)]
    lines = []
    for each, colour in zip(series, colours, strict=True):
        dash = " stroke-dasharray='5 3'" if each.dashed else ""
        label = f"<title>{escape(each.label or what)}</title>"
        for run in _segments(each.points):
            if len(run) == 1:  # a lone figure between gaps: a dot, or it would not show
                x, y = xy(*run[0])
                lines.append(f"<circle cx='{x}' cy='{y}' r='2.5' fill='{colour}'>{label}</circle>")
                continue
            points = " ".join(",".join(xy(at, v)) for at, v in run)
            lines.append(
                f"<polyline fill='none' stroke='{colour}' stroke-width='2'{dash} "
                f"points='{points}'>{label}</polyline>"
            )
    labelled = [(s, c) for s, c in zip(series, colours, strict=True) if s.label]
    per_row = max(1, width // LEGEND_ITEM)
    legend = []
    for index, (each, colour) in enumerate(labelled):
        left = index % per_row * LEGEND_ITEM
        top = height + AXIS_ROW + index // per_row * LEGEND_ROW + 8
        dash = " stroke-dasharray='5 3'" if each.dashed else ""
        legend.append(
            f"<line x1='{left + 2}' x2='{left + 22}' y1='{top}' y2='{top}' stroke='{colour}' "
            f"stroke-width='2'{dash}/><text x='{left + 26}' y='{top + 4}'>"
            f"{escape(each.label)}</text>"
        )
    total = height + AXIS_ROW + -(-len(labelled) // per_row) * LEGEND_ROW
    return (
        f"<svg id='{chart_id}' class='chart' width='{width}' height='{total}' role='img' "
        f"font-size='11'><title>{escape(what)}</title>"
        f"<rect class='plot' width='{width}' height='{height}'/>{''.join(lines)}"
        f"<text x='4' y='12'>{escape(figure(high))} {escape(unit)}</text>"
        f"<text x='4' y='{height - 4}'>{escape(figure(low))} {escape(unit)}</text>"
        f"<text x='2' y='{height + 11}'>{escape(_clock(t0, t1))}</text>"
        f"<text x='{width - 2}' y='{height + 11}' text-anchor='end'>"
        f"{escape(_clock(t1, t0))}</text>{''.join(legend)}</svg>"
    )
