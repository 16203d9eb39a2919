"""``edgeagent bench``: latency, throughput and memory of every variant that works here.

Each variant runs in a fresh child process, one after the other, so that its peak RSS is its own
and one runtime's thread pools or caches cannot slow the next. Latency is per batch; throughput
is images per second over the timed window.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import platform
import resource
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from edgeagent.commands.extras import missing_extra
from edgeagent.commands.helpfmt import DefaultsFormatter
from edgeagent.commands.infer import add_variant_arguments
from edgeagent.models.locate import resolve_package
from edgeagent.models.package import ModelPackage, PackageError, load_package
from edgeagent.models.session import VariantChoiceError, matching_variants, open_variant


@dataclass
class BenchResult:
    variant: str
    runtime: str
    device: str
    precision: str
    batch: int
    iterations: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    throughput_ips: float
    peak_rss_mb: float
    error: str = ""
    latencies_ms: list[float] | None = None


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench",
        formatter_class=DefaultsFormatter,
        help="benchmark every runtime × precision of a model that works here",
        description=(
            "Time MODEL on every matching variant (each in its own process): p50/p90/p99 batch "
            "latency, throughput in images/s and peak RSS. Filter with --runtime/--precision."
        ),
    )
    parser.add_argument("model", help="package directory or name (e.g. mobilenet_v2)")
    add_variant_arguments(parser)
    parser.add_argument("--batch", type=int, default=1, help="images per inference (default 1)")
    parser.add_argument("--seconds", type=float, default=3.0, help="timed run per variant")
    parser.add_argument("--warmup", type=int, default=5, help="untimed runs first (default 5)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument(
        "--plot",
        type=Path,
        metavar="PNG",
        help="write a plot of the latency distributions (needs the [plot] extra: matplotlib)",
    )
    parser.set_defaults(handler=run)


def bench_inputs(package: ModelPackage, batch: int) -> np.ndarray:
    """Real preprocessed images when the package has golden inputs, else seeded noise."""
    if package.golden is not None:
        with np.load(package.golden) as golden:
            images = golden["inputs"].astype(np.float32)
        return np.concatenate([images] * (batch // len(images) + 1))[:batch]
    shape = [batch if d == -1 else d for d in package.inputs[0].shape]
    shape[0] = batch
    return np.random.default_rng(0).standard_normal(shape).astype(np.float32)


def measure(
    package_dir: Path,
    runtime: str,
    precision: str,
    device: str | None,
    threads: int | None,
    batch: int,
    seconds: float,
    warmup: int,
) -> BenchResult:
    """Load one variant and time it; runs inside the child process."""
    package = load_package(package_dir)
    key = f"{runtime}/{precision}"
    try:
        session = open_variant(package, runtime, precision, device, threads)
    except VariantChoiceError as exc:
        return BenchResult(
            key, runtime, device or "CPU", precision, batch, 0, 0, 0, 0, 0, 0, str(exc)
        )
    feeds = {package.inputs[0].name: bench_inputs(package, batch)}
    for _ in range(warmup):
        session.run(feeds)
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline or len(latencies) < 5:
        started = time.perf_counter()
        session.run(feeds)
        latencies.append((time.perf_counter() - started) * 1000)
    values = np.array(latencies)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return BenchResult(
        variant=key,
        runtime=runtime,
        device=session.device,
        precision=precision,
        batch=batch,
        iterations=len(latencies),
        p50_ms=float(np.percentile(values, 50)),
        p90_ms=float(np.percentile(values, 90)),
        p99_ms=float(np.percentile(values, 99)),
        throughput_ips=batch * len(latencies) / (values.sum() / 1000),
        peak_rss_mb=rss_mb,
        latencies_ms=[round(v, 4) for v in latencies],
    )


def _child(queue: multiprocessing.Queue, *args: object) -> None:
    try:
        queue.put(measure(*args))  # type: ignore[arg-type]
    except Exception as exc:  # report any failure of one variant instead of losing the table
        queue.put(exc)


def run_isolated(*args: object, timeout_s: float = 600.0) -> BenchResult | Exception:
    context = multiprocessing.get_context("spawn")
    queue: multiprocessing.Queue = context.Queue()
    process = context.Process(target=_child, args=(queue, *args))
    process.start()
    try:
        result = queue.get(timeout=timeout_s)
    except Exception as exc:  # queue.Empty: the child hung or died
        result = RuntimeError(f"benchmark process gave no result: {exc!r}")
    process.join(timeout=10)
    if process.is_alive():
        process.kill()
    return result


def run(args: argparse.Namespace) -> int:
    missing = missing_extra("plot", "matplotlib") if args.plot is not None else None
    if missing:  # checked before any benchmark runs: a missing extra costs no minutes of timing
        print(f"edgeagent bench: --plot {missing}", file=sys.stderr)
        return 2
    try:
        package_dir = resolve_package(args.model, args.models_dir)
        package = load_package(package_dir)
    except PackageError as exc:
        print(f"edgeagent bench: {exc}", file=sys.stderr)
        return 2
    variants = matching_variants(package, args.runtime, args.precision)
    if not variants:
        print(f"edgeagent bench: {package.name} has no matching variant", file=sys.stderr)
        return 2
    results: list[BenchResult] = []
    for index, variant in enumerate(variants, 1):
        print(f"[{index}/{len(variants)}] {variant.key} …", file=sys.stderr, flush=True)
        outcome = run_isolated(
            package_dir,
            variant.runtime,
            variant.precision,
            args.device,
            args.threads,
            args.batch,
            args.seconds,
            args.warmup,
        )
        if isinstance(outcome, Exception):
            outcome = BenchResult(
                variant.key,
                variant.runtime,
                "-",
                variant.precision,
                args.batch,
                0,
                0,
                0,
                0,
                0,
                0,
                str(outcome),
            )
        results.append(outcome)
    if args.plot:
        write_plot(args.plot, package.name, results)
    if args.json:
        print(json.dumps([asdict(r) | {"latencies_ms": None} for r in results], indent=2))
    else:
        print(format_table(package, results))
    return 0 if any(not r.error for r in results) else 1


def format_table(package: ModelPackage, results: list[BenchResult]) -> str:
    lines = [
        f"{package.name} v{package.version}, batch {results[0].batch}",
        "",
        "| runtime | device | precision | p50 ms | p90 ms | p99 ms | images/s | vs fp32 "
        "| peak RSS MB |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        if r.error:
            lines.append(f"| {r.runtime} | - | {r.precision} | failed: {r.error} | | | | | |")
        else:
            lines.append(
                f"| {r.runtime} | {r.device} | {r.precision} | {r.p50_ms:.2f} | {r.p90_ms:.2f} "
                f"| {r.p99_ms:.2f} | {r.throughput_ips:.1f} | {speedup_vs_fp32(r, results)} "
                f"| {r.peak_rss_mb:.0f} |"
            )
    return "\n".join(lines)


def speedup_vs_fp32(result: BenchResult, results: list[BenchResult]) -> str:
    """p50 of the same runtime's fp32 variant over this one's, measured in the same run."""
    base = next(
        (
            r
            for r in results
            if r.runtime == result.runtime and r.precision == "fp32" and not r.error
        ),
        None,
    )
    if base is None or result.p50_ms <= 0:
        return "-"
    return f"{base.p50_ms / result.p50_ms:.2f}×"


def write_plot(path: Path, title: str, results: list[BenchResult]) -> None:
    """Box plot of per-batch latency for each variant, from 0 ms, with each p99 marked.

    Whiskers span p1–p99 and outliers are drawn, so a slow tail stays visible; the title names
    the model, batch size, host and its CPU, the x labels each variant's device.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = [r for r in results if r.latencies_ms]
    figure, axis = plt.subplots(figsize=(9, 4.5))
    axis.boxplot([r.latencies_ms or [] for r in measured], whis=(1, 99), showfliers=True)
    positions = range(1, len(measured) + 1)
    axis.scatter(positions, [r.p99_ms for r in measured], marker="_", s=400, color="red",
                 label="p99", zorder=3)  # fmt: skip
    labels = [f"{r.runtime} {r.precision}\n{r.device}" for r in measured]
    axis.set_xticks(list(positions), labels, fontsize=8)
    axis.set_ylim(bottom=0)
    axis.set_ylabel("latency per batch (ms)")
    axis.legend(loc="upper right")
    batch = measured[0].batch if measured else "?"
    host = f"{platform.node()} ({platform.machine()}, {platform.processor() or 'CPU'})"
    axis.set_title(f"{title}: batch {batch} on {host}", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    print(f"wrote {path}", file=sys.stderr)
