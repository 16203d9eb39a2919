"""Run one variant in a process of its own: its answers, batch-1 latency and peak RSS.

A process per variant is what makes the RSS figure mean something (each runtime's arena and
compiled kernels, not the sum of all loaded before it), and a runtime that crashes costs only
its own variant. ``python -m edgeagent.packaging.measure JOB.json`` writes ``JOB.npz`` and
prints one JSON line.
"""

from __future__ import annotations

import json
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from edgeagent.runtimes import LoadRequest, get_runtime

# The feeds file's mark of a stack of whole feeds (packaging.feeds writes it); no input name
# starts with a dot in any format this reads.
STACKED = ".stacked"


def peak_rss_kib() -> int:
    """This process's own peak RSS (VmHWM): ru_maxrss would keep the parent's from before exec."""
    for line in Path("/proc/self/status").read_text(encoding="utf-8").splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # pragma: no cover - not Linux


def measure(job: dict) -> dict:
    started = time.perf_counter()
    session = get_runtime(job["runtime"]).load(
        LoadRequest(
            files=tuple(Path(f) for f in job["files"]),
            precision=job["precision"],
            threads=job.get("threads"),
            layout=job.get("layout"),
            input_names=tuple(job["input_names"]),
            output_names=tuple(job["output_names"]),
        )
    )
    load_ms = (time.perf_counter() - started) * 1000
    with np.load(job["inputs"]) as data:
        feeds = {name: data[name] for name in job["input_names"]}
        stacked = STACKED in data.files  # whole feeds, one a sample (packaging.feeds)
    rows = len(next(iter(feeds.values())))
    if stacked:  # a fixed batch, or inputs not batched on their first axis: one at a time
        parts = [session.run({n: np.asarray(a[i]) for n, a in feeds.items()}) for i in range(rows)]
        outputs = {n: np.stack([p[n] for p in parts]) for n in job["output_names"]}
        one = {n: np.asarray(a[0]) for n, a in feeds.items()}
    else:
        chunk = int(job.get("batch", 16))
        parts = [
            session.run({n: a[i : i + chunk] for n, a in feeds.items()})
            for i in range(0, rows, chunk)
        ]
        outputs = {n: np.concatenate([p[n] for p in parts]) for n in job["output_names"]}
        one = {n: a[:1] for n, a in feeds.items()}
    np.savez(
        job["outputs"],
        allow_pickle=False,
        **{f"out_{i}": outputs[n] for i, n in enumerate(job["output_names"])},
    )
    for _ in range(3):
        session.run(one)  # warm-up: first runs allocate and pick kernels
    times = []
    for _ in range(int(job.get("repeats", 30))):
        tick = time.perf_counter()
        session.run(one)
        times.append((time.perf_counter() - tick) * 1000)
    session.close()
    return {
        "load_ms": round(load_ms, 1),
        "latency_ms_p50": round(statistics.median(times), 3),
        "latency_ms_p90": round(sorted(times)[int(0.9 * (len(times) - 1))], 3),
        "peak_rss_mb": round(peak_rss_kib() / 1024, 1),
    }


def main(argv: list[str]) -> int:
    job = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    print(json.dumps(measure(job)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
