#!/usr/bin/env python3
"""How busy the machine is while edgeagent serves one path: is a throughput bound CPU or a wait?

``bench_serving.py`` reports CPU per request of the daemon and of its client; this adds what
those figures cannot show, the share of the machine left idle, and how the daemon's CPU splits
over its threads (the event loop, the JSON parsing thread, the inference workers and
onnxruntime's pool; Python 3.11 does not name native threads, so they are listed by id, busiest
first). When the machine is well below all cores busy at high concurrency, requests wait on a
serial step rather than on CPU.

    python scripts/bench_busy.py                                 # v2 JSON, c=16, 3 rounds of 8 s
    python scripts/bench_busy.py --mode "v2 binary" --concurrency 4 --seconds 5 --json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

import bench_serving
import numpy as np
import psutil

from devtools.bench_daemon import start_daemon, wait_ready
from devtools.package import pinned_package
from edgeagent.models.package import load_package


def machine_times() -> tuple[float, float]:
    """(all, idle) CPU seconds of the whole machine so far, over every core."""
    times = psutil.cpu_times()
    return sum(times), times.idle + getattr(times, "iowait", 0.0)


def thread_seconds(process: psutil.Process) -> dict[int, float]:
    """CPU seconds of each live thread of ``process``."""
    return {t.id: t.user_time + t.system_time for t in process.threads()}


async def run(args: argparse.Namespace) -> dict:
    package = load_package(args.model)
    spec = package.inputs[0]
    shape = [1 if d == -1 else d for d in spec.shape]
    frame = np.random.default_rng(1).standard_normal(shape).astype(spec.dtype)
    cores = psutil.cpu_count()
    with tempfile.TemporaryDirectory(prefix="bench-busy-") as tmp:
        pinned = pinned_package(args.model, args.precision, Path(tmp) / "pinned" / package.name)
        daemon = start_daemon(pinned, Path(tmp), args.threads)
        try:
            await wait_ready(daemon.sock, daemon.process)
            url, body, headers = bench_serving.requests_for(package, frame)[args.mode]
            measure = bench_serving.served_measure(
                daemon.sock, url, body, headers, args.concurrency
            )
            await measure(2.0)  # warm-up: threads started, arenas grown
            served = psutil.Process(daemon.process.pid)
            result: dict = {
                "mode": args.mode,
                "concurrency": args.concurrency,
                "cores": cores,
                "threads": args.threads or cores,
                "rounds": [],
            }
            if not args.json:
                print(
                    f"{args.mode}, c={args.concurrency}, {cores} cores, intra-op threads "
                    f"{result['threads']}"
                )
            for _ in range(args.rounds):
                all_before, idle_before = machine_times()
                threads_before = thread_seconds(served)
                client_before = time.process_time()
                latencies, elapsed, errors, _ = await measure(args.seconds)
                all_after, idle_after = machine_times()
                threads_after = thread_seconds(served)
                requests = max(len(latencies), 1)
                busy = 1 - (idle_after - idle_before) / (all_after - all_before)
                per_thread = sorted(
                    (
                        1e3 * (seconds - threads_before.get(tid, 0.0)) / requests
                        for tid, seconds in threads_after.items()
                    ),
                    reverse=True,
                )
                row = {
                    "requests_per_s": len(latencies) / elapsed,
                    "errors": errors,
                    "machine_busy_pct": 100 * busy * cores,
                    "daemon_ms_per_request": sum(per_thread),
                    "daemon_thread_ms_per_request": [ms for ms in per_thread if ms >= 0.05],
                    "client_ms_per_request": 1e3 * (time.process_time() - client_before) / requests,
                }
                result["rounds"].append(row)
                if not args.json:
                    print(
                        f"  {row['requests_per_s']:6.1f} req/s, {errors} errors; machine busy "
                        f"{row['machine_busy_pct']:.0f} % of {100 * cores}; daemon "
                        f"{row['daemon_ms_per_request']:.2f} ms/req over its threads "
                        f"[{', '.join(f'{ms:.2f}' for ms in row['daemon_thread_ms_per_request'])}]"
                        f"; client {row['client_ms_per_request']:.2f} ms/req"
                    )
        finally:
            daemon.process.terminate()
            daemon.process.wait()
    return result


def main() -> int:
    description = __doc__.split("\n\n")[0]
    parser = bench_serving.one_path_options(description, seconds=8.0, rounds=3)
    parser.add_argument("--json", action="store_true", help="print the rounds as JSON")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    if args.json:
        print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
