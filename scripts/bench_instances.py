#!/usr/bin/env python3
"""One model on two devices against one, through the real batcher and InstanceGroup.

(a) Simulated accelerators of known service time (``devtools/simulated_runtime.py``: the
    model's real outputs, then the rest of the device's time slept off the GIL): one device of
    ``--fast-ms`` against two equal ones, and against one fast + one ``--slow-ms`` device. The
    goal is ≥ 1.8× for two equal devices; for unequal ones the ideal is (1/a + 1/b) / (1/a).
(b) Two CPU instances of a real model (``--package``, zoo/mobilenet_v2 by default), one
    intra-op thread each, each pinned to its own core (``os.sched_setaffinity`` on the worker
    thread that runs it: a one-thread onnxruntime session computes on its caller's thread),
    against one such instance on one core — served (the batcher merging up to ``--batch`` rows)
    and in process (each instance run back to back by its own thread with ``--batch`` rows: what
    the cores alone give, without the event loop, the clients and the hand-offs).

Every set-up runs closed loop at ``--concurrency`` clients in alternating rounds (the
order reverses each round, so drift favours none); the report gives each set-up's median
rows/s, the median of the per-round ratios, the batches each instance took and the load average
(other work on a shared machine shows there, not in the ratios' medians).

    .venv/bin/python scripts/bench_instances.py --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from prometheus_client import CollectorRegistry  # noqa: E402

from devtools.simulated_runtime import SimulatedRuntime  # noqa: E402
from devtools.tiny import write_tiny_package  # noqa: E402
from devtools.zoo import zoo_dir  # noqa: E402
from edgeagent.engine.busy_counter import LoadCounter  # noqa: E402
from edgeagent.engine.metrics import EngineMetrics  # noqa: E402
from edgeagent.engine.serving import ModelFactory  # noqa: E402
from edgeagent.engine.settings import EngineSettings  # noqa: E402
from edgeagent.hardware.instances import InstanceGroup, Lane  # noqa: E402
from edgeagent.hardware.plan_search import MeasuredPlan, PlanShape  # noqa: E402
from edgeagent.models.golden import sample_feeds  # noqa: E402
from edgeagent.models.package import ModelPackage, load_package  # noqa: E402
from edgeagent.models.session import load_request  # noqa: E402
from edgeagent.runtimes import Session, TensorInfo, get_runtime  # noqa: E402

PLAN = MeasuredPlan(PlanShape(1, 1, 1), "fixed", 1)


class Pinned(Session):
    """A session whose runs execute on one core: the calling worker thread is pinned to it for
    the run and given its previous cores back after."""

    def __init__(self, session: Session, core: int) -> None:
        self.session, self.core = session, core
        self.runtime, self.device = session.runtime, f"CPU{core}"
        self.precision = session.precision

    @property
    def inputs(self) -> list[TensorInfo]:
        return list(self.session.inputs)

    @property
    def outputs(self) -> list[TensorInfo]:
        return list(self.session.outputs)

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        before = os.sched_getaffinity(0)  # 0: this thread
        os.sched_setaffinity(0, {self.core})
        try:
            return self.session.run(feeds)
        finally:
            os.sched_setaffinity(0, before)

    def close(self) -> None:
        self.session.close()


def group(sessions: list[Session], plan: MeasuredPlan = PLAN) -> InstanceGroup:
    """One lane (one instance) per session, each its own device."""
    lanes = [Lane(str(s.device), plan, [s]) for s in sessions[1:]]
    return InstanceGroup([sessions[0]], plan, lanes)


def in_process(sessions: list[Session], feeds: Mapping[str, np.ndarray], seconds: float) -> float:
    """Rows/s of every session run back to back by a thread of its own (no serving path)."""
    rows = next(iter(feeds.values())).shape[0]
    counts = [0] * len(sessions)
    stop = time.perf_counter() + seconds

    def loop(index: int) -> None:
        while time.perf_counter() < stop:
            sessions[index].run(feeds)
            counts[index] += rows

    began = time.perf_counter()
    with ThreadPoolExecutor(len(sessions)) as pool:
        list(pool.map(loop, range(len(sessions))))
    return sum(counts) / (time.perf_counter() - began)


async def closed_loop(
    package: ModelPackage, sessions: InstanceGroup, concurrency: int, seconds: float, pool
) -> tuple[float, list[int]]:
    """Rows/s of ``concurrency`` clients through the batcher; batches per instance. The model
    (and its sessions) close at the end."""
    factory = ModelFactory(
        EngineSettings(max_batch_size=sessions.plan.shape.batch, max_queue=concurrency * 2),
        executor=pool,
        metrics=EngineMetrics(CollectorRegistry()),
        load=LoadCounter(),
    )
    model = factory.build(package, sessions)
    feeds = sample_feeds(package)
    await asyncio.gather(*(model.infer(feeds) for _ in range(sessions.instances)))  # warm-up
    before = [i.batches for i in sessions.scheduler.instances]
    stop = time.perf_counter() + seconds
    done = [0] * concurrency

    async def client(index: int) -> None:
        while time.perf_counter() < stop:
            await model.infer(feeds)
            done[index] += 1

    began = time.perf_counter()
    await asyncio.gather(*(client(i) for i in range(concurrency)))
    elapsed = time.perf_counter() - began
    after = [i.batches for i in sessions.scheduler.instances]
    await model.close(5)
    return sum(done) / elapsed, [a - b for a, b in zip(after, before, strict=True)]


def compare(
    package: ModelPackage,
    setups: dict[str, Callable[[], InstanceGroup]],
    args: argparse.Namespace,
) -> dict:
    """Alternating rounds of every set-up (sessions loaded afresh each round, outside the
    window); medians, and the median of per-round ratios to the first set-up."""
    rates: dict[str, list[float]] = {name: [] for name in setups}
    shares: dict[str, list[int]] = {}
    loads = []
    with ThreadPoolExecutor(max(4, args.concurrency // 4)) as pool:
        for round_ in range(args.rounds):
            names = list(setups) if round_ % 2 == 0 else list(reversed(setups))
            for name in names:
                rate, batches = asyncio.run(
                    closed_loop(package, setups[name](), args.concurrency, args.duration, pool)
                )
                rates[name].append(rate)
                old = shares.get(name, [0] * len(batches))
                shares[name] = [s + b for s, b in zip(old, batches, strict=True)]
            loads.append(os.getloadavg()[0])
    base = next(iter(setups))
    report: dict = {}
    for name in setups:
        ratios = [r / b for r, b in zip(rates[name], rates[base], strict=True)]
        report[name] = {
            "rows_per_s": round(statistics.median(rates[name]), 1),
            "over_one": round(statistics.median(ratios), 3),
            "batches_per_instance": shares[name],
            "rounds": [round(r, 1) for r in rates[name]],
        }
    report["load_average"] = [round(x, 2) for x in loads]
    return report


def simulated(args: argparse.Namespace) -> dict:
    fast, slow = args.fast_ms / 1e3, args.slow_ms / 1e3
    sim = SimulatedRuntime({"SIM0": fast, "SIM1": fast, "SIM2": slow}).install()
    with tempfile.TemporaryDirectory() as tmp:
        package = load_package(write_tiny_package(Path(tmp) / "tiny"))
        variant = package.variants[0]

        def on(device: str) -> Session:
            return sim.load(load_request(package, variant, device=device, threads=1))

        report = compare(
            package,
            {
                f"one {args.fast_ms:g} ms": lambda: group([on("SIM0")]),
                f"two {args.fast_ms:g} ms": lambda: group([on("SIM0"), on("SIM1")]),
                f"{args.fast_ms:g} + {args.slow_ms:g} ms": lambda: group([on("SIM0"), on("SIM2")]),
            },
            args,
        )
    report["ideal_unequal"] = round((1 / fast + 1 / slow) / (1 / fast), 3)
    return report


def pinned_cpu(args: argparse.Namespace) -> dict:
    package = load_package(args.package)
    variant = package.variant("onnxruntime", args.precision)
    if variant is None:
        raise SystemExit(f"{args.package} has no onnxruntime/{args.precision} variant")
    runtime = get_runtime("onnxruntime")
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("pinning two instances needs two cores")

    def on(core: int) -> Session:
        request = load_request(package, variant, device="CPUExecutionProvider", threads=1)
        return Pinned(runtime.load(request), core)

    plan = MeasuredPlan(PlanShape(1, 1, args.batch), "fixed", 1)
    report = compare(
        package,
        {
            f"one instance on core {cores[0]}": lambda: group([on(cores[0])], plan),
            f"two instances on cores {cores[0]},{cores[1]}": lambda: group(
                [on(cores[0]), on(cores[1])], plan
            ),
        },
        args,
    )
    report["in_process"] = in_process_pair(package, [on(c) for c in cores[:2]], args)
    return report


def in_process_pair(package: ModelPackage, pinned: list[Session], args: argparse.Namespace) -> dict:
    """One pinned instance against two, in process, alternating rounds; rows/s and ratios."""
    feeds = {k: np.concatenate([v] * args.batch) for k, v in sample_feeds(package).items()}
    one: list[float] = []
    two: list[float] = []
    try:
        for round_ in range(args.rounds):
            order = (1, 2) if round_ % 2 == 0 else (2, 1)
            for count in order:
                (one if count == 1 else two).append(
                    in_process(pinned[:count], feeds, args.duration)
                )
    finally:
        for session in pinned:
            session.close()
    ratios = [b / a for a, b in zip(one, two, strict=True)]
    return {
        "one_rows_per_s": round(statistics.median(one), 1),
        "two_rows_per_s": round(statistics.median(two), 1),
        "over_one": round(statistics.median(ratios), 3),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--package", type=Path, default=zoo_dir() / "mobilenet_v2")
    parser.add_argument("--precision", default="int8")
    parser.add_argument("--fast-ms", type=float, default=10.0)
    parser.add_argument("--slow-ms", type=float, default=20.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument(
        "--batch", type=int, default=1, help="rows a CPU instance runs at once (the plan's batch)"
    )
    parser.add_argument("--duration", type=float, default=2.0, help="seconds a round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", choices=("simulated", "cpu"), default=None)
    parser.add_argument("--json", type=Path, default=None, help="write the report here")
    args = parser.parse_args()
    report = {"cpus": len(os.sched_getaffinity(0))}
    if args.only in (None, "simulated"):
        report["simulated"] = simulated(args)
    if args.only in (None, "cpu"):
        report["pinned_cpu"] = pinned_cpu(args)
    text = json.dumps(report, indent=2)
    print(text)
    if args.json is not None:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
