#!/usr/bin/env python3
"""The execution plan's search against the full grid it chooses from, in one sitting (issue 28).

Runs the plan search exactly as the agent does at load (``hardware.plan_search.search``, its
default budget), then measures every shape of the same grid — threads × instances × batch with
the same total threads — closed loop in process with longer windows, in alternating rounds
(the order reverses each round, so drift favours no shape), and reports the median of each,
the best, and the pick's median as a fraction of the best (goal ≥ 0.95). The agent's shape
before plans (one instance of every core, batch max_batch_size) is reported beside them.

    .venv/bin/python scripts/bench_plan.py --package zoo/mobilenet_v2 --runtime onnxruntime

Served throughput against the naive server (v2 binary, c=16) is measured by
``scripts/bench_serving.py --peers``, whose daemon now serves the plan it searched at load.
"""

from __future__ import annotations

import argparse
import json
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--package", type=Path, default=REPO / "zoo" / "mobilenet_v2")
    parser.add_argument("--runtime", default="onnxruntime")
    parser.add_argument("--precision", default="int8")
    parser.add_argument("--cores", type=int, default=default_threads())
    parser.add_argument("--seconds", type=float, default=1.0, help="window per shape and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--search-s", type=float, default=2.0, help="the search's budget")
    parser.add_argument("--json", type=Path, help="also write the report here")
    args = parser.parse_args()

    package = load_package(args.package)
    variant = package.variant(args.runtime, args.precision)
    if variant is None:
        print(f"{package.name} has no {args.runtime}/{args.precision} variant", file=sys.stderr)
        return 2
    runtime = get_runtime(args.runtime)
    pool = SessionPool(
        lambda threads: runtime.load(load_request(package, variant, threads=threads))
    )
    feeds = sample_feeds(package)
    request = PlanRequest(max_batch=package.serving.max_batch_size, search_s=args.search_s)
    began = time.perf_counter()
    plan = search(pool, feeds, args.cores, request)
    search_s = time.perf_counter() - began
    grid = shapes(args.cores, request)
    before = PlanShape(1, args.cores, package.serving.max_batch_size)
    if before not in grid:
        grid.append(before)
    inputs = {b: batch_feeds(feeds, b) for b in {s.batch for s in grid}}
    samples: dict[PlanShape, list[float]] = {s: [] for s in grid}
    for round_ in range(args.rounds):
        for shape in grid if round_ % 2 == 0 else reversed(grid):
            sessions = pool.get(shape.threads, shape.instances)
            samples[shape].append(closed_loop(sessions, inputs[shape.batch], args.seconds))
    pool.close()
    medians = {s: statistics.median(v) for s, v in samples.items()}
    best = max(medians, key=lambda s: medians[s])
    report = {
        "model": f"{package.name} {variant.key}",
        "cores": args.cores,
        "search": {"pick": plan.shape.label, "seconds": round(search_s, 2), **plan.to_dict()},
        "grid_rows_per_s": {s.label: round(m, 1) for s, m in medians.items()},
        "rounds": {s.label: [round(v, 1) for v in vs] for s, vs in samples.items()},
        "best": best.label,
        "pick_over_best": round(medians[plan.shape] / medians[best], 3),
        "before_plans": before.label,
        "pick_over_before": round(medians[plan.shape] / medians[before], 3),
    }
    print(f"{report['model']}, {args.cores} threads, {args.rounds} alternating rounds of "
          f"{args.seconds:g} s")  # fmt: skip
    print("| threads x instances : batch | rows/s (median) | rounds |")
    print("|---|---:|---|")
    for shape in grid:
        marks = (
            ("  **pick**" if shape == plan.shape else "")
            + ("  best" if shape == best else "")
            + ("  before plans" if shape == before else "")
        )
        rounds = ", ".join(f"{v:.0f}" for v in samples[shape])
        print(f"| {shape.label}{marks} | {medians[shape]:.1f} | {rounds} |")
    print(f"search: {plan.shape.label} in {search_s:.2f} s; pick/best {report['pick_over_best']}, "
          f"pick/before {report['pick_over_before']}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
