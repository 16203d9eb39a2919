#!/usr/bin/env python3
"""The execution plan's search against the full grid it chooses from, in one sitting.

Runs the plan search exactly as the agent does at load (``hardware.plan_search.search``, its
default budget, from a pool holding only the probe's session of every allowed thread, so its
cost includes the loads the agent pays) ``--searches`` times, and between the searches measures
every shape of the same grid — instances × threads × batch with the same total threads —
closed loop in process, in rounds of short windows with the order reversed each round, so
drift of a shared machine touches every shape alike.

Shapes are compared by paired ratios: in each round, a shape's throughput over another's
measured in the same round, a window or two apart; the figures are medians over the rounds.
"best" is the shape whose median ratio to every other is highest; a search's pick/best is the
median over the rounds of pick ÷ best, with the quartiles of those ratios and the share of
rounds in which the pick reached 0.95 (goal: pick/best ≥ 0.95). The agent's shape before plans
(one instance of every core, batch max_batch_size) is reported beside them.

    .venv/bin/python scripts/bench_plan.py --package zoo/mobilenet_v2 --runtime onnxruntime

Served throughput against the naive server (v2 binary, c=16) is measured by
``scripts/bench_serving.py --peers``, whose daemon serves the plan it searched at load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from edgeagent.hardware.plan_search import (  # noqa: E402
    PlanRequest,
    PlanShape,
    SessionPool,
    batch_feeds,
    closed_loop,
    search,
    shapes,
)
from edgeagent.models.golden import sample_feeds  # noqa: E402
from edgeagent.models.package import load_package  # noqa: E402
from edgeagent.models.session import load_request  # noqa: E402
from edgeagent.runtimes import get_runtime  # noqa: E402
from edgeagent.runtimes.base import default_threads  # noqa: E402

Round = dict[PlanShape, float]


def ratios(rounds: list[Round], shape: PlanShape, to: PlanShape) -> list[float]:
    """``shape``'s throughput over ``to``'s, one ratio per round."""
    return [r[shape] / r[to] for r in rounds if r[to] > 0]


def best_shape(rounds: list[Round], grid: list[PlanShape]) -> PlanShape:
    """The shape whose worst median paired ratio against any other shape is highest."""

    def worst(shape: PlanShape) -> float:
        others = [s for s in grid if s != shape]
        return min(statistics.median(ratios(rounds, shape, s)) for s in others)

    return max(grid, key=worst)


def quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        return (values[0],) * 3 if values else (0.0, 0.0, 0.0)
    low, middle, high = statistics.quantiles(values, n=4, method="inclusive")
    return low, middle, high


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--package", type=Path, default=REPO / "zoo" / "mobilenet_v2")
    parser.add_argument("--runtime", default="onnxruntime")
    parser.add_argument("--precision", default="int8")
    parser.add_argument("--cores", type=int, default=default_threads())
    parser.add_argument("--window", type=float, default=0.2, help="grid: seconds per window")
    parser.add_argument("--rounds", type=int, default=12, help="grid rounds in all")
    parser.add_argument("--searches", type=int, default=3, help="searches, between grid rounds")
    parser.add_argument("--search-s", type=float, help="the search's budget ([server] default)")
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args()

    package = load_package(args.package)
    variant = package.variant(args.runtime, args.precision)
    if variant is None:
        print(f"{package.name} has no {args.runtime}/{args.precision} variant", file=sys.stderr)
        return 2
    runtime = get_runtime(args.runtime)

    def open_session(threads: int):
        return runtime.load(load_request(package, variant, threads=threads))

    feeds = sample_feeds(package)
    budget = {} if args.search_s is None else {"search_s": args.search_s}
    request = PlanRequest(max_batch=package.serving.max_batch_size, **budget)
    grid = shapes(args.cores, request)
    before = PlanShape(1, args.cores, package.serving.max_batch_size)
    if before not in grid:
        grid.append(before)
    inputs = {b: batch_feeds(feeds, b) for b in {s.batch for s in grid}}
    pool = SessionPool(open_session)
    for shape in grid:  # first runs allocate: not inside any window
        for session in pool.get(shape.threads, shape.instances):
            session.run(inputs[shape.batch])
    rounds: list[Round] = []
    searches = []
    per_gap = max(1, args.rounds // max(1, args.searches))
    while len(rounds) < args.rounds or len(searches) < args.searches:
        if len(searches) < args.searches:
            searches.append(timed_search(open_session, feeds, args.cores, request))
        for _ in range(min(per_gap, args.rounds - len(rounds))):
            order = grid if len(rounds) % 2 == 0 else grid[::-1]
            rounds.append(
                {
                    s: closed_loop(pool.get(s.threads, s.instances), inputs[s.batch], args.window)
                    for s in order
                }
            )
    pool.close()
    best = best_shape(rounds, grid)
    medians = {s: statistics.median(ratios(rounds, s, best)) for s in grid}
    rates = {s: statistics.median(r[s] for r in rounds) for s in grid}
    report_searches = []
    for plan, seconds in searches:
        paired = ratios(rounds, plan.shape, best)
        low, middle, high = quartiles(paired)
        report_searches.append(
            {
                "pick": plan.shape.label,
                "seconds": round(seconds, 3),
                "search_ms": plan.search_ms,
                "windows": sum(plan.rounds.values()),
                "pick_over_best": round(middle, 3),
                "pick_over_best_quartiles": [round(low, 3), round(high, 3)],
                "rounds_at_least_0.95": f"{sum(v >= 0.95 for v in paired)}/{len(paired)}",
                "figures": dict(plan.figures),
            }
        )
    report = {
        "model": f"{package.name} {variant.key}",
        "cores": args.cores,
        "load_average": [round(v, 2) for v in os.getloadavg()],
        "grid": {
            s.label: {"rows_per_s": round(rates[s], 1), "over_best": round(medians[s], 3)}
            for s in grid
        },
        "best": best.label,
        "before_plans": before.label,
        "before_over_best": round(medians[before], 3),
        "searches": report_searches,
    }
    print_report(report, args, grid, best, before, rounds, searches)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


def timed_search(open_session, feeds, cores: int, request: PlanRequest):
    """One search as at load: the pool holds the probe's session (every allowed thread)."""
    pool = SessionPool(open_session)
    pool.add(cores, open_session(cores))
    began = time.perf_counter()
    plan = search(pool, feeds, cores, request)
    seconds = time.perf_counter() - began
    pool.close()
    return plan, seconds


def print_report(report, args, grid, best, before, rounds, searches) -> None:
    picks = {plan.shape for plan, _ in searches}
    print(
        f"{report['model']}, {args.cores} threads, {len(rounds)} alternating rounds of "
        f"{args.window:g} s windows, load average {report['load_average']}"
    )
    print("| instances x threads : batch | rows/s (median) | ÷ best (median of paired ratios) |")
    print("|---|---:|---:|")
    for shape in grid:
        marks = (
            ("  **pick**" if shape in picks else "")
            + ("  best" if shape == best else "")
            + ("  before plans" if shape == before else "")
        )
        entry = report["grid"][shape.label]
        print(f"| {shape.label}{marks} | {entry['rows_per_s']:.1f} | {entry['over_best']:.3f} |")
    for index, each in enumerate(report["searches"], 1):
        low, high = each["pick_over_best_quartiles"]
        print(
            f"search {index}: {each['pick']} in {each['seconds']:.2f} s with loads "
            f"({each['windows']} windows); pick/best {each['pick_over_best']} "
            f"(quartiles {low}-{high}; rounds >= 0.95: {each['rounds_at_least_0.95']})"
        )
    print(f"before plans ({before.label})/best {report['before_over_best']}")


if __name__ == "__main__":
    sys.exit(main())
