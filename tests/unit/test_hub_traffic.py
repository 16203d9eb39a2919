"""Throughput, error share and latency from successive state reports, and the charts that draw
them: every figure comes from two reports' counters over the device's clock, and where no figure
would be honest the line breaks instead of bridging the gap."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from edgeagent.hub.server.dashboard.charts import Series, figure, line_chart
from edgeagent.hub.server.reports import parse_state
from edgeagent.hub.server.traffic import model_series


def row(
    at: float,
    requests: int | None,
    errors: int = 0,
    *,
    version: str = "1.0.0",
    reported_at: float | None = None,
    p95: float | None = 9.0,
    model: str = "m",
) -> dict[str, Any]:
    """One state row of the history, as ``reports.state_columns`` writes its summary."""
    traffic = (
        {}
        if requests is None
        else {model: {"requests": requests, "errors": errors, "p50_ms": 4.0, "p95_ms": p95}}
    )
    detail = {"models": {model: version}, "traffic": traffic, "reported_at": reported_at}
    return {"at": at, "detail": detail}


def values(points: list[tuple[float, float | None]]) -> list[float | None]:
    return [value for _, value in points]


def test_rates_are_counter_differences_over_the_devices_clock() -> None:
    rows = [
        row(1000.0, 100, 1, reported_at=500.0),
        row(1070.0, 400, 4, reported_at=560.0),  # the hub's clock says 70 s, the device's 60
        row(1130.0, 1000, 64, reported_at=620.0),
    ]
    found = model_series(rows)["m"]
    assert values(found.throughput) == [None, 5.0, 10.0]
    assert values(found.error_pct) == [None, 1.0, 10.0]
    assert values(found.p95_ms) == [None, 9.0, 9.0]
    assert [at for at, _ in found.throughput] == [1000.0, 1070.0, 1130.0]  # drawn at hub time
    assert found.latest("throughput") == 10.0


def test_without_the_device_clock_the_hubs_is_used() -> None:
    found = model_series([row(10.0, 0), row(30.0, 40)])["m"]
    assert values(found.throughput) == [None, 2.0]


@pytest.mark.parametrize(
    ("second", "third", "then", "why"),
    [
        (row(60, 50, reported_at=60), row(120, 650, reported_at=120), 10.0, "counter went down"),
        (
            row(60, 500, version="2", reported_at=60),
            row(120, 1100, version="2", reported_at=120),
            10.0,
            "another version's counters",
        ),
        (row(60, 500, reported_at=0), row(120, 1700, reported_at=120), 10.0, "no time between"),
        (row(60, None, reported_at=60), row(120, 1300, reported_at=120), None, "no traffic sent"),
    ],
)
def test_no_figure_where_none_would_be_honest(
    second: dict[str, Any], third: dict[str, Any], then: float | None, why: str
) -> None:
    found = model_series([row(0.0, 100, reported_at=0.0), second, third])["m"]
    assert values(found.throughput)[1] is None, why
    assert values(found.error_pct)[1] is None and values(found.p95_ms)[1] is None
    assert values(found.throughput)[2] == then  # counted on from the second report


def test_an_interval_without_requests_has_throughput_zero_but_no_share_or_latency() -> None:
    found = model_series([row(0.0, 10, 1), row(60.0, 10, 1)])["m"]
    assert values(found.throughput) == [None, 0.0]
    assert values(found.error_pct) == [None, None] and values(found.p95_ms) == [None, None]


def test_rows_from_before_the_counters_chart_nothing() -> None:
    old = {"at": 1.0, "detail": {"models": {"m": "1"}, "max_temp_c": 50.0}}
    assert model_series([old, {**old, "at": 2.0}]) == {}


def test_the_summary_keeps_the_counters_and_the_clock() -> None:
    report = {
        "updated_at": 1700000000.5,
        "models": {
            "m": {
                "active_version": "1",
                "traffic": {"requests": 12, "errors": 2, "p50_ms": 1.5, "p95_ms": 3.25},
            },
            "idle": {"active_version": None, "traffic": {"requests": 1}},  # nothing active
            "old": {"active_version": "1"},  # an agent from before the counters
            "bogus": {"active_version": "1", "traffic": {"requests": -5}},
        },
    }
    summary = parse_state(json.dumps(report).encode()).summary
    assert summary["reported_at"] == 1700000000.5
    assert summary["traffic"] == {"m": {"requests": 12, "errors": 2, "p50_ms": 1.5, "p95_ms": 3.25}}


def test_a_chart_breaks_its_line_at_gaps_and_dots_a_lone_figure() -> None:
    points = [(0.0, 1.0), (1.0, 2.0), (2.0, None), (3.0, 4.0), (4.0, None), (5.0, 1.0), (6.0, 3)]
    svg = line_chart("rate", [Series("m", points)], "req/s", "throughput", from_zero=True)
    assert svg.count("<polyline") == 2 and svg.count("<circle") == 1
    assert "0 req/s" in svg and f"{figure(4.0 * 1.1)} req/s" in svg  # from zero to the top


def test_a_chart_labels_each_series_and_escapes_them() -> None:
    hostile = "<script>alert(1)</script>"
    svg = line_chart(
        "lat",
        [
            Series(f"{hostile} p95", [(0.0, 1.0), (1.0, 2.0)]),
            Series("b", [(0.0, 1), (1, 1)], "", True),
        ],
        "ms",
        "latency",
    )
    assert hostile not in svg and "&lt;script&gt;" in svg
    assert svg.count("stroke-dasharray") == 2  # the dashed line and its legend entry
    assert len(re.findall(r"<text x='\d+' y='\d+'>(?:&lt;|b)", svg)) == 2  # a legend each


def test_fewer_than_two_times_is_a_note_not_a_chart() -> None:
    note = line_chart("temperature", [Series("", [(1.0, 50.0), (2.0, None)])], "°C", "temperature")
    assert "<svg" not in note and "Not enough temperature samples" in note


def test_a_temperature_axis_spans_its_values_not_zero() -> None:
    svg = line_chart("t", [Series("", [(0.0, 50.0), (1.0, 80.0)])], "°C", "temperature")
    assert "47 °C" in svg and "83 °C" in svg  # a 10 % margin of the 30 °C swing
