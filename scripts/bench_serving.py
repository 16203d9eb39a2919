#!/usr/bin/env python3
"""Serving overhead benchmark: raw in-process onnxruntime vs the daemon over its Unix socket.

One run, one model, the same thread settings on both sides: the baseline is a batch-1 loop on
an in-process session of the very variant the daemon serves; the daemon is a real
``edgeagent run`` process, driven over its Unix socket with v2 binary, v2 JSON and
/v1/classify (JPEG) at several concurrencies. Reports throughput, p50/p99 latency and the
daemon's RSS (idle after load, and the peak under load), as a markdown table or --json.

Both sides share this machine's cores (the client is this process), so served figures include
the cost of the client too; compare ratios from one run, never absolute numbers across runs.

    python scripts/bench_serving.py                       # zoo/mobilenet_v2, 5 s per cell
    python scripts/bench_serving.py --model DIR --duration 3 --json
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import numpy as np
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from devtools.package import keep_variants  # noqa: E402
from edgeagent.api.v2 import HEADER_LENGTH, encode_request  # noqa: E402
from edgeagent.models.package import load_package  # noqa: E402
from edgeagent.models.session import open_variant  # noqa: E402

TARGET_IDLE_RSS_MB = 120
TARGET_OVERHEAD_MS = 1.0


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.array(values), q)) if values else float("nan")


def summarize(name: str, concurrency: int, latencies: list[float], elapsed: float, errors: int):
    return {
        "mode": name,
        "concurrency": concurrency,
        "requests": len(latencies),
        "errors": errors,
        "throughput": len(latencies) / elapsed if elapsed else 0.0,
        "p50_ms": percentile(latencies, 50) * 1e3,
        "p99_ms": percentile(latencies, 99) * 1e3,
    }


def raw_round(session, feeds, duration: float) -> tuple[list[float], float]:
    """The baseline: one in-process session, batch 1, back to back, for ``duration`` s."""
    latencies = []
    start = time.perf_counter()
    while time.perf_counter() - start < duration:
        t0 = time.perf_counter()
        session.run(feeds)
        latencies.append(time.perf_counter() - t0)
    return latencies, time.perf_counter() - start


Measure = Callable[[float], Awaitable[tuple[list[float], float, int, int]]]


def raw_measure(session, feeds, rows: int) -> Measure:
    """In-process runs of a whole batch: the ceiling that batching can reach."""

    async def measure(seconds: float):
        latencies, elapsed = raw_round(session, feeds, seconds)
        return latencies, elapsed, 0, rows

    return measure


def served_measure(sock: Path, url: str, body: bytes, headers, concurrency: int) -> Measure:
    async def measure(seconds: float):
        latencies, elapsed, errors = await drive(sock, url, body, headers, concurrency, seconds)
        return latencies, elapsed, errors, 1

    return measure


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


async def paired(name: str, concurrency: int, measure: Measure, session, feeds, daemon, args):
    """Alternate ``measure`` with raw batch-1 rounds, so both see the same machine speed.

    Also counts the CPU time the daemon and this process (the client) spent per request: on a
    machine with few cores, that is what served throughput pays for against raw.
    """
    lat: list[float] = []
    raw_lat: list[float] = []
    time_served = time_raw = cpu_daemon = cpu_client = 0.0
    errors = rows = 0
    for _ in range(args.rounds):
        latencies, elapsed = raw_round(session, feeds, args.duration / args.rounds)
        raw_lat += latencies
        time_raw += elapsed
        daemon_before, client_before = cpu_seconds(daemon), time.process_time()
        latencies, elapsed, failed, rows = await measure(args.duration / args.rounds)
        cpu_daemon += cpu_seconds(daemon) - daemon_before
        cpu_client += time.process_time() - client_before
        lat += latencies
        time_served += elapsed
        errors += failed
    row = summarize(name, concurrency, lat, time_served, errors)
    row["_latencies"] = lat  # for --plot; dropped from the JSON report
    row["daemon_cpu_ms"] = cpu_daemon / max(1, len(lat)) * 1e3
    row["client_cpu_ms"] = cpu_client / max(1, len(lat)) * 1e3
    row["throughput"] *= rows  # a raw batch answers `rows` images
    baseline = summarize("raw batch-1", 1, raw_lat, time_raw, 0)
    row["raw_throughput"] = baseline["throughput"]
    row["raw_p50_ms"] = baseline["p50_ms"]
    row["ratio"] = row["throughput"] / baseline["throughput"]
    row["overhead_p50_ms"] = row["p50_ms"] - baseline["p50_ms"]
    return row, raw_lat, time_raw


def requests_for(package, frame: np.ndarray) -> dict[str, tuple[str, bytes, dict[str, str]]]:
    """Pre-encoded bodies (the client's encoding cost stays out of the daemon's figures)."""
    from PIL import Image

    name = package.name
    infer = f"http://agent/v2/models/{name}/infer"
    spec = package.inputs[0]
    binary, length = encode_request({spec.name: frame}, binary=True)
    as_json, _ = encode_request({spec.name: frame}, binary=False)
    bodies = {
        "v2 binary": (infer, binary, {HEADER_LENGTH: str(length)}),
        "v2 JSON": (infer, as_json, {"Content-Type": "application/json"}),
    }
    if package.preprocess is not None:
        rng = np.random.default_rng(0)
        height, width = package.preprocess.size
        pixels = rng.integers(0, 255, (height + 32, width + 32, 3), dtype=np.uint8)
        jpeg = io.BytesIO()
        Image.fromarray(pixels).save(jpeg, format="JPEG", quality=90)
        bodies["classify JPEG"] = (
            f"http://agent/v1/models/{name}/classify",
            jpeg.getvalue(),
            {"Content-Type": "image/jpeg"},
        )
    return bodies


async def drive(sock: Path, url: str, body: bytes, headers, concurrency: int, duration: float):
    """``concurrency`` clients posting back to back for ``duration`` seconds."""
    latencies: list[float] = []
    errors = 0
    connector = aiohttp.UnixConnector(path=str(sock), limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as client:
        for _ in range(3):  # warm the connections and the path
            async with client.post(url, data=body, headers=headers) as response:
                await response.read()
                if response.status != 200:
                    raise SystemExit(f"{url}: HTTP {response.status}: {await response.text()}")
        stop = time.perf_counter() + duration

        async def worker() -> None:
            nonlocal errors
            while time.perf_counter() < stop:
                t0 = time.perf_counter()
                async with client.post(url, data=body, headers=headers) as response:
                    await response.read()
                    if response.status == 200:
                        latencies.append(time.perf_counter() - t0)
                    else:
                        errors += 1

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    return latencies, elapsed, errors


class PeakRss:
    """Samples a process's RSS in a thread; ``peak`` is the highest seen."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


async def wait_ready(sock: Path, process: subprocess.Popen, timeout: float = 300) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the daemon exited with {process.returncode}")
        try:
            connector = aiohttp.UnixConnector(path=str(sock))
            async with (
                aiohttp.ClientSession(connector=connector) as client,
                client.get("http://agent/v2/health/ready") as response,
            ):
                if response.status == 200:
                    async with client.get("http://agent/v1/status") as status:
                        return await status.json()
                async with client.post("http://agent/v2/repository/index") as index:
                    failed = [m for m in await index.json() if m["state"] == "UNAVAILABLE"]
                if failed:  # it listens only after loading: this model will not come
                    raise SystemExit(f"the daemon could not load a model: {failed}")
        except (aiohttp.ClientError, OSError):
            pass
        await asyncio.sleep(0.2)
    raise SystemExit("the daemon did not become ready")


def pinned_package(package_dir: Path, precision: str, target: Path) -> Path:
    """A copy of the package that offers only its onnxruntime ``precision`` variant.

    The daemon picks the device's best candidate (LiteRT or OpenVINO may rank first); the
    comparison is onnxruntime against itself, so the served package has nothing else to pick.
    model.toml keeps every table except the other [[variant]] blocks; files are copied (a
    package refuses symlinks that point outside it).
    """
    package = load_package(package_dir)
    chosen = package.variant("onnxruntime", precision)
    if chosen is None:
        raise SystemExit(f"{package_dir} has no onnxruntime {precision} variant")
    others = {f for v in package.variants if v is not chosen for f in v.files}
    target.mkdir(parents=True)
    for path in package.root.iterdir():
        if path.is_file() and path not in others:
            shutil.copyfile(path, target / path.name)
    keep_variants(target, lambda v: v["runtime"] == "onnxruntime" and v["precision"] == precision)
    return target


def start_daemon(package_dir: Path, work: Path, threads: int) -> tuple[subprocess.Popen, Path]:
    """``edgeagent run`` on just this package; ``threads`` = [hardware] threads (0: all cores)."""
    config = work / "agent.toml"
    config.write_text(f"[hardware]\nthreads = {threads}\n")
    models = work / "models"
    models.mkdir()
    (models / package_dir.name).symlink_to(package_dir.resolve())
    sock = work / "agent.sock"
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "XDG_STATE_HOME": str(work / "state")}
    command = [sys.executable, "-m", "edgeagent.cli", "run", "--config", str(config)]
    command += ["--models-dir", str(models)]
    command += ["--socket", str(sock), "--port", "0"]
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=work
    )
    return process, sock


def mapped_runtimes(pid: int) -> list[str]:
    """Inference runtimes whose libraries the daemon has mapped (they dominate its RSS)."""
    names = ("onnxruntime", "openvino", "ai_edge_litert", "tflite_runtime")
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return []
    return [name for name in names if f"/{name}/" in maps]


def markdown(report: dict) -> str:
    raw = report["raw"]
    lines = [
        f"Model {report['model']} ({report['backend']}), {report['cpus']} CPUs, "
        f"intra-op threads {report['threads'] or 'all cores'}, "
        f"{report['duration_s']:g} s per cell, each alternated with raw batch-1 rounds",
        "",
        "| path | concurrency | req/s | p50 ms | p99 ms | errors | raw req/s (same rounds) "
        "| × raw | p50 − raw p50 ms | daemon CPU ms/req | client CPU ms/req |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| raw batch-1 (all rounds) | 1 | {raw['throughput']:.1f} | {raw['p50_ms']:.2f} | "
        f"{raw['p99_ms']:.2f} | 0 | | | | | |",
    ]
    for row in report["rows"]:
        lines.append(
            f"| {row['mode']} | {row['concurrency']} | {row['throughput']:.1f} | "
            f"{row['p50_ms']:.2f} | {row['p99_ms']:.2f} | {row['errors']} | "
            f"{row['raw_throughput']:.1f} | {row['ratio']:.2f} | {row['overhead_p50_ms']:+.2f} | "
            f"{row['daemon_cpu_ms']:.2f} | {row['client_cpu_ms']:.2f} |"
        )
    lines += [
        "",
        f"Daemon RSS idle (model loaded): {report['rss_idle_mb']:.0f} MB "
        f"(target ≤ {TARGET_IDLE_RSS_MB}); peak under load: {report['rss_loaded_mb']:.0f} MB; "
        f"runtimes mapped: {', '.join(report['runtimes_mapped'])}",
        f"p50 overhead at c=1, v2 binary vs raw: {report['overhead_c1_ms']:.2f} ms "
        f"(target ≤ {TARGET_OVERHEAD_MS})",
        f"v2 binary c=16 throughput / raw batch-1: {report['c16_ratio']:.2f} (target ≥ 1)",
    ]
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> dict:
    package = load_package(args.model)
    spec = package.inputs[0]
    shape = [1 if d == -1 else d for d in spec.shape]
    frame = np.random.default_rng(1).standard_normal(shape).astype(spec.dtype)
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as tmp:
        pinned = pinned_package(
            Path(args.model), args.precision, Path(tmp) / "pinned" / package.name
        )
        process, sock = start_daemon(pinned, Path(tmp), args.threads)
        try:
            status = await wait_ready(sock, process)
            versions = status["models"][package.name]["versions"]
            backend = next(iter(versions.values()))
            await asyncio.sleep(1.0)
            rss_idle = psutil.Process(process.pid).memory_info().rss
            where = f"{backend['runtime']} {backend['device']} {backend['precision']}"
            progress(f"daemon ready on {where}; idle RSS {rss_idle / 2**20:.0f} MB")
            session = open_variant(
                package,
                runtime="onnxruntime",
                precision=args.precision,
                threads=args.threads or None,
            )
            feeds = {spec.name: frame}
            raw_round(session, feeds, 0.5)  # warm-up
            batch = package.serving.max_batch_size
            batch_feeds = {spec.name: np.repeat(frame, batch, axis=0)}
            bodies = {m: b for m, b in requests_for(package, frame).items() if m in args.modes}
            cells: list[tuple[str, int, Measure]] = [
                (f"raw batch-{batch} (img/s)", 1, raw_measure(session, batch_feeds, batch))
            ]
            cells += [
                (mode, c, served_measure(sock, url, body, headers, c))
                for mode, (url, body, headers) in bodies.items()
                for c in args.concurrency
            ]
            rows = []
            all_raw: list[float] = []
            raw_time = 0.0
            with PeakRss(process.pid) as peak:
                for name, concurrency, measure in cells:
                    row, raw_lat, elapsed = await paired(
                        name,
                        concurrency,
                        measure,
                        session,
                        feeds,
                        psutil.Process(process.pid),
                        args,
                    )
                    all_raw += raw_lat
                    raw_time += elapsed
                    rows.append(row)
                    progress(
                        f"{name} c={concurrency}: {row['throughput']:.1f}/s "
                        f"p50 {row['p50_ms']:.2f} ms (raw {row['raw_throughput']:.1f}/s "
                        f"p50 {row['raw_p50_ms']:.2f} ms)"
                    )
            session.close()
            raw = summarize("raw batch-1", 1, all_raw, raw_time, 0)
            runtimes = mapped_runtimes(process.pid)
        finally:
            process.terminate()
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
    binary = {r["concurrency"]: r for r in rows if r["mode"] == "v2 binary"}
    return {
        "model": package.name,
        "backend": f"{backend['runtime']} {backend['device']} {backend['precision']}",
        "cpus": len(os.sched_getaffinity(0)),
        "threads": args.threads,
        "duration_s": args.duration,
        "raw": raw,
        "raw_latencies": all_raw,
        "rows": rows,
        "rss_idle_mb": rss_idle / 2**20,
        "rss_loaded_mb": peak.peak / 2**20,
        "overhead_c1_ms": binary[1]["overhead_p50_ms"] if 1 in binary else float("nan"),
        "c16_ratio": binary[16]["ratio"] if 16 in binary else float("nan"),
        "runtimes_mapped": runtimes,
        "exit_code": process.returncode,
    }


def plot(report: dict, path: Path) -> None:
    """Box plots of the latencies of every cell (log scale), raw batch-1 first."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rows"]
    labels = ["raw batch-1"] + [f"{r['mode']}\nc={r['concurrency']}" for r in rows]
    data = [report["raw_latencies"]] + [r["_latencies"] for r in rows]
    figure, axes = plt.subplots(figsize=(max(8, len(labels) * 0.9), 5))
    axes.boxplot([[v * 1e3 for v in d] or [float("nan")] for d in data], showfliers=False)
    axes.set_xticks(range(1, len(labels) + 1), labels, fontsize=7)
    axes.set_yscale("log")
    axes.set_ylabel("latency per request (ms, log scale)")
    axes.set_title(f"{report['model']} on {report['backend']}: raw in-process vs served")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    progress(f"plot written to {path}")


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=REPO / "zoo" / "mobilenet_v2")
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per cell")
    parser.add_argument(
        "--precision", default="int8", help="the onnxruntime variant both sides run (int8)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="intra-op threads on both sides ([hardware] threads); 0 = every core",
    )
    parser.add_argument(
        "--rounds", type=int, default=4, help="raw/served alternations per cell (drift)"
    )
    parser.add_argument(
        "--concurrency", type=lambda s: [int(c) for c in s.split(",")], default=[1, 4, 16]
    )
    parser.add_argument(
        "--modes",
        type=lambda s: s.split(","),
        default=["v2 binary", "v2 JSON", "classify JPEG"],
        help="comma-separated subset of: v2 binary, v2 JSON, classify JPEG",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--plot", type=Path, metavar="PNG", help="write the latency distributions per path"
    )
    args = parser.parse_args()
    report = asyncio.run(run(args))
    if args.plot:
        plot(report, args.plot)
    for row in report["rows"]:
        del row["_latencies"]
    del report["raw_latencies"]
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
