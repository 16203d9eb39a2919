#!/usr/bin/env python3
"""Serving overhead benchmark: raw in-process onnxruntime vs the daemon over its Unix socket.

One run, one model, the same thread settings on both sides: the baseline is a batch-1 loop on
an in-process session of the very variant the daemon serves; the daemon is a real
``edgeagent run`` process, driven over its Unix socket with v2 binary, v2 JSON and
/v1/classify (JPEG) at several concurrencies. Reports throughput, p50/p99 latency and the
daemon's RSS (idle after load, and the peak under load), as a markdown table or --json.

Both sides share this machine's cores (the client is this process), so served figures include
the cost of the client too; compare ratios from one run, never absolute numbers across runs.

With ``--peers`` the same run also measures the peers (scripts/bench_peers.py): a naive
aiohttp + onnxruntime server (v2 binary and JSON) and MLServer (v2 JSON; installed once into
``.venv-mlserver``), on the same ONNX file and thread count, and edgeagent over its Unix socket,
TCP, gRPC (both) and the shared-memory extension; every edgeagent row gets its ratio to the
naive server (same encoding and transport; gRPC and shm against naive binary on the socket) and,
for JSON, to MLServer; and each server's CPU per request and peak RSS.

    python scripts/bench_serving.py                       # zoo/mobilenet_v2, 5 s per cell
    python scripts/bench_serving.py --model DIR --duration 3 --json
    python scripts/bench_serving.py --peers --seconds 2 --threads 2 \
        --plot docs/perf/serving-peers.png
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


from devtools.bench_daemon import (  # noqa: E402
    Daemon,
    start_daemon,
    stop_tree,
    wait_plan,
    wait_ready,
)
from devtools.http_endpoint import Endpoint, http_client  # noqa: E402
from devtools.package import pinned_package  # noqa: E402
from devtools.serving_peers import Peers, probe_binary, start_peers  # noqa: E402
from devtools.serving_report import markdown, plot  # noqa: E402
from devtools.shm_client import ShmRegions  # noqa: E402
from devtools.zoo import zoo_dir  # noqa: E402
from edgeagent.api.v2 import HEADER_LENGTH, encode_request  # noqa: E402
from edgeagent.hardware.plan_search import PlanShape, closed_loop  # noqa: E402
from edgeagent.models.package import load_package  # noqa: E402
from edgeagent.models.session import open_variant  # noqa: E402


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


def plan_measure(sessions, feeds, rows: int) -> Measure:
    """The daemon's execution plan in process: its instances closed loop, each its own
    session and thread (``plan_search.closed_loop``), merging ``rows`` rows; one latency per
    run (the mean), so the row's throughput is the loop's."""

    async def measure(seconds: float):
        rate = closed_loop(sessions, feeds, seconds)
        runs = max(1, round(rate * seconds / rows))
        return [len(sessions) * rows / rate] * runs if rate else [], seconds, 0, rows

    return measure


def plan_cell(package, frame: np.ndarray, plan: dict, precision: str, process) -> Cell | None:
    """The served plan (``/v1/status``) measured in process: what served throughput is a
    fraction of; None for a version served without a measured plan."""
    if plan.get("threads") is None:
        return None
    instances, batch = int(plan["instances"]), int(plan["max_batch_size"])
    sessions = [
        open_variant(package, runtime="onnxruntime", precision=precision, threads=plan["threads"])
        for _ in range(instances)
    ]
    feeds = {package.inputs[0].name: np.repeat(frame, batch, axis=0)}
    label = PlanShape(instances, int(plan["threads"]), batch).label
    return Cell(
        "raw", f"raw plan {label} (img/s)", "", 1, plan_measure(sessions, feeds, batch), process
    )


def served_measure(
    endpoint: Endpoint, url: str, bodies: bytes | Sequence[bytes], headers, concurrency: int
) -> Measure:
    """HTTP requests; ``bodies`` is one body, or one per worker (shared-memory outputs)."""
    per_worker = [bodies] if isinstance(bodies, bytes) else list(bodies)

    async def measure(seconds: float):
        latencies, elapsed, errors = await drive(
            endpoint, url, per_worker, headers, concurrency, seconds
        )
        return latencies, elapsed, errors, 1

    return measure


def grpc_measure(target: str, request: bytes, concurrency: int, token: str = "") -> Measure:
    """KServe v2 gRPC ModelInfer with a pre-serialized request (the client encodes nothing);
    ``token`` is sent as TCP needs it."""
    metadata = (("authorization", f"Bearer {token}"),) if token else None

    async def measure(seconds: float):
        import grpc

        latencies: list[float] = []
        errors = 0
        limit = 64 * 2**20
        options = [("grpc.max_receive_message_length", limit)]
        async with grpc.aio.insecure_channel(target, options=options) as channel:
            call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
            for _ in range(3):
                await call(request, metadata=metadata)
            stop = time.perf_counter() + seconds

            async def worker() -> None:
                nonlocal errors
                while time.perf_counter() < stop:
                    t0 = time.perf_counter()
                    try:
                        await call(request, metadata=metadata)
                    except grpc.RpcError:
                        errors += 1
                    else:
                        latencies.append(time.perf_counter() - t0)

            start = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            elapsed = time.perf_counter() - start
        return latencies, elapsed, errors, 1

    return measure


def cpu_seconds(process: psutil.Process) -> float:
    """CPU time of ``process`` and its live children (MLServer infers in worker processes)."""
    total = 0.0
    for each in [process, *process.children(recursive=True)]:
        try:
            times = each.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


@dataclass
class Tally:
    """One cell's rounds so far: each served round and the raw batch-1 round just before it."""

    latencies: list[float] = field(default_factory=list)
    raw_latencies: list[float] = field(default_factory=list)
    throughputs: list[float] = field(default_factory=list)  # per round, images/s
    raw_throughputs: list[float] = field(default_factory=list)
    p50s: list[float] = field(default_factory=list)  # ms, per round
    raw_p50s: list[float] = field(default_factory=list)
    raw_time: float = 0.0
    cpu_daemon: float = 0.0
    cpu_client: float = 0.0
    errors: int = 0


async def measure_round(cell: Cell, tally: Tally, session, feeds, seconds: float) -> None:
    """One raw batch-1 round, then one round of the cell: both see the same machine speed.

    Also counts the CPU time the server and this process (the client) spent: on a machine with
    few cores, that is what served throughput pays for against raw.
    """
    latencies, elapsed = raw_round(session, feeds, seconds)
    tally.raw_latencies += latencies
    tally.raw_time += elapsed
    tally.raw_throughputs.append(len(latencies) / elapsed)
    tally.raw_p50s.append(percentile(latencies, 50) * 1e3)
    daemon_before, client_before = cpu_seconds(cell.process), time.process_time()
    latencies, elapsed, failed, rows = await cell.measure(seconds)
    tally.cpu_daemon += cpu_seconds(cell.process) - daemon_before
    tally.cpu_client += time.process_time() - client_before
    tally.latencies += latencies
    tally.throughputs.append(len(latencies) * rows / elapsed if elapsed else 0.0)
    tally.p50s.append(percentile(latencies, 50) * 1e3)
    tally.errors += failed


def cell_row(cell: Cell, tally: Tally) -> dict:
    """Medians over the rounds (throughput, p50, ratios to the raw round before each); p99 and
    CPU per request over all of them."""
    count = len(tally.latencies)
    row = summarize(cell.name, cell.concurrency, tally.latencies, 1.0, tally.errors)
    row.update(server=cell.server, transport=cell.transport, name=cell.name, mode=cell.mode)
    row["_latencies"] = tally.latencies  # for --plot; dropped from the JSON report
    row["throughput"] = statistics.median(tally.throughputs)
    row["p50_ms"] = statistics.median(tally.p50s)
    row["daemon_cpu_ms"] = tally.cpu_daemon / max(1, count) * 1e3
    row["client_cpu_ms"] = tally.cpu_client / max(1, count) * 1e3
    row["raw_throughput"] = statistics.median(tally.raw_throughputs)
    row["raw_p50_ms"] = statistics.median(tally.raw_p50s)
    pairs = zip(tally.throughputs, tally.raw_throughputs, strict=True)
    row["ratio"] = statistics.median(served / raw for served, raw in pairs)
    p50s = zip(tally.p50s, tally.raw_p50s, strict=True)
    row["overhead_p50_ms"] = statistics.median(served - raw for served, raw in p50s)
    return row


def requests_for(package, frame: np.ndarray) -> dict[str, tuple[str, bytes, dict[str, str]]]:
    """Pre-encoded bodies (the client's encoding cost stays out of the daemon's figures)."""
    from PIL import Image

    name = package.name
    infer = f"/v2/models/{name}/infer"
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
            f"/v1/models/{name}/classify",
            jpeg.getvalue(),
            {"Content-Type": "image/jpeg"},
        )
    return bodies


async def drive(
    endpoint: Endpoint,
    url: str,
    bodies: list[bytes],
    headers,
    concurrency: int,
    duration: float,
):
    """``concurrency`` clients posting back to back for ``duration`` seconds."""
    latencies: list[float] = []
    errors = 0
    async with http_client(endpoint, concurrency) as client:
        for body in (bodies * 3)[: max(3, len(bodies))]:  # warm the connections and the path
            async with client.post(url, data=body, headers=headers) as response:
                await response.read()
                if response.status != 200:
                    raise SystemExit(f"{url}: HTTP {response.status}: {await response.text()}")
        stop = time.perf_counter() + duration

        async def worker(body: bytes) -> None:
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
        await asyncio.gather(*(worker(bodies[i % len(bodies)]) for i in range(concurrency)))
        elapsed = time.perf_counter() - start
    return latencies, elapsed, errors


class PeakRss:
    """Samples a process tree's RSS in a thread; ``peak`` is the highest seen."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.peak = 0
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def rss(self) -> int:
        total = 0
        for each in [self.process, *self.process.children(recursive=True)]:
            try:
                total += each.memory_info().rss
            except psutil.NoSuchProcess:
                continue
        return total

    def _run(self) -> None:
        try:
            while not self._stop.wait(0.05):
                self.peak = max(self.peak, self.rss())
        except BaseException as exc:  # re-raised by __exit__: a dead sampler is no peak
            self._error = exc

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        if self._error is not None:
            raise RuntimeError(f"the peak RSS sampler died: {self._error!r}") from self._error


def mapped_runtimes(pid: int) -> list[str]:
    """Inference runtimes whose libraries the daemon has mapped (they dominate its RSS)."""
    names = ("onnxruntime", "openvino", "ai_edge_litert", "tflite_runtime")
    try:
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return []
    return [name for name in names if f"/{name}/" in maps]


# ---------------------------------------------------------------------------------------------
# Cells: one server × path × concurrency each

FLOOR = "HTTP floor: v2 binary, no model"


@dataclass
class Cell:
    server: str  # "raw", "edgeagent", "naive", "MLServer"
    mode: str  # "v2 binary", "v2 JSON", "gRPC", "shm", "classify JPEG", "raw batch-8 (img/s)"
    transport: str  # "unix", "tcp", "" (in process)
    concurrency: int
    measure: Measure
    process: psutil.Process

    @property
    def name(self) -> str:
        return (
            self.mode if self.server == "raw" else f"{self.server} {self.mode} ({self.transport})"
        )


def grpc_request(package, frame: np.ndarray) -> bytes:
    from edgeagent.api.grpc.proto import inference_pb2 as pb

    spec = package.inputs[0]
    request = pb.ModelInferRequest(model_name=package.name)
    request.inputs.add(name=spec.name, datatype="FP32", shape=frame.shape)
    request.raw_input_contents.append(frame.tobytes())
    return request.SerializeToString()


def peer_cells(args, package, frame, daemon: Daemon, peers: Peers, shm_bodies) -> list[Cell]:
    """Every served cell of a --peers run, in the order they are measured."""
    bodies = requests_for(package, frame)
    url, binary, binary_headers = bodies["v2 binary"]
    _, as_json, json_headers = bodies["v2 JSON"]
    agent = psutil.Process(daemon.process.pid)
    grpc_body = grpc_request(package, frame)
    bearer = {"Authorization": f"Bearer {daemon.token}"}
    binary_tcp_headers, json_tcp_headers = {**binary_headers, **bearer}, {**json_headers, **bearer}
    paths: list[tuple[str, str, str, psutil.Process, Callable[[int], Measure]]] = []
    if peers.naive is not None and peers.naive_sock is not None:
        naive = psutil.Process(peers.naive.pid)
        sock, port = peers.naive_sock, peers.naive_port
        paths += [
            (
                "naive",
                "v2 binary",
                "unix",
                naive,
                lambda c: served_measure(sock, url, binary, binary_headers, c),
            ),
            (
                "naive",
                "v2 binary",
                "tcp",
                naive,
                lambda c: served_measure(port, url, binary, binary_headers, c),
            ),
            (
                "naive",
                "v2 JSON",
                "tcp",
                naive,
                lambda c: served_measure(port, url, as_json, json_headers, c),
            ),
        ]
    if peers.mlserver is not None:
        mlserver = psutil.Process(peers.mlserver.pid)
        ml_port = peers.mlserver_port
        paths.append(
            (
                "MLServer",
                "v2 JSON",
                "tcp",
                mlserver,
                lambda c: served_measure(ml_port, url, as_json, json_headers, c),
            )
        )
    paths += [
        (
            "edgeagent",
            "v2 binary",
            "unix",
            agent,
            lambda c: served_measure(daemon.sock, url, binary, binary_headers, c),
        ),
        (
            "edgeagent",
            "v2 binary",
            "tcp",
            agent,
            lambda c: served_measure(daemon.tcp_port, url, binary, binary_tcp_headers, c),
        ),
        (
            "edgeagent",
            "v2 JSON",
            "unix",
            agent,
            lambda c: served_measure(daemon.sock, url, as_json, json_headers, c),
        ),
        (
            "edgeagent",
            "v2 JSON",
            "tcp",
            agent,
            lambda c: served_measure(daemon.tcp_port, url, as_json, json_tcp_headers, c),
        ),
        (
            "edgeagent",
            "gRPC",
            "unix",
            agent,
            lambda c: grpc_measure(f"unix:{daemon.grpc_sock}", grpc_body, c),
        ),
        (
            "edgeagent",
            "gRPC",
            "tcp",
            agent,
            lambda c: grpc_measure(f"127.0.0.1:{daemon.grpc_port}", grpc_body, c, daemon.token),
        ),
        (
            "edgeagent",
            "shm",
            "unix",
            agent,
            lambda c: served_measure(daemon.sock, url, shm_bodies[:c], json_headers, c),
        ),
    ]
    cells = [
        Cell(server, mode, transport, c, factory(c), process)
        for server, mode, transport, process, factory in paths
        for c in args.concurrency
    ]
    if peers.naive is not None and peers.naive_sock is not None and 1 in args.concurrency:
        # The naive server's handling with no model run: the round trip no served p50 at
        # c=1 can go below (raw p50 + this), whatever the server does.
        floor = url.replace("/infer", "/floor")
        measure = served_measure(peers.naive_sock, floor, binary, binary_headers, 1)
        cells.insert(0, Cell("naive", FLOOR, "unix", 1, measure, psutil.Process(peers.naive.pid)))
    return cells


def add_ratios(rows: list[dict]) -> None:
    """Each edgeagent row's throughput against the naive server's and MLServer's (same c)."""
    by_key = {(r["server"], r["mode"], r["transport"], r["concurrency"]): r for r in rows}
    for row in rows:
        if row["server"] != "edgeagent":
            continue
        c = row["concurrency"]
        if row["mode"] in ("gRPC", "shm"):
            naive = by_key.get(("naive", "v2 binary", "unix", c))
        else:
            naive = by_key.get(("naive", row["mode"], row["transport"], c))
        if naive is not None and naive["throughput"]:
            row["x_naive"] = row["throughput"] / naive["throughput"]
        mlserver = by_key.get(("MLServer", "v2 JSON", "tcp", c))
        if row["mode"] == "v2 JSON" and mlserver is not None and mlserver["throughput"]:
            row["x_mlserver"] = row["throughput"] / mlserver["throughput"]


def served_over_plan(rows: list[dict], served: dict | None) -> float:
    """v2 binary c=16 over the daemon's plan run in process, the median of the two cells'
    throughputs (each measured after the same raw rounds)."""
    plan = next((r for r in rows if r["mode"].startswith("raw plan")), None)
    if served is None or plan is None or not plan["throughput"]:
        return float("nan")
    return served["throughput"] / plan["throughput"]


async def run(args: argparse.Namespace) -> dict:
    package = load_package(args.model)
    spec = package.inputs[0]
    shape = [1 if d == -1 else d for d in spec.shape]
    frame = np.random.default_rng(1).standard_normal(shape).astype(spec.dtype)
    peers = Peers(notes=[])
    regions: ShmRegions | None = None
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as tmp:
        pinned = pinned_package(
            Path(args.model), args.precision, Path(tmp) / "pinned" / package.name
        )
        started = time.perf_counter()
        daemon = start_daemon(pinned, Path(tmp), args.threads, peers=args.peers)
        process = daemon.process
        try:
            await wait_ready(daemon.sock, process)
            ready_s = time.perf_counter() - started  # a fresh state: no plan cached
            status = await wait_plan(daemon.sock, package.name)
            plan_s = time.perf_counter() - started
            progress(f"daemon ready in {ready_s:.2f} s, its plan measured at {plan_s:.2f} s")
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
            agent = psutil.Process(process.pid)
            cells = [
                Cell(
                    "raw",
                    f"raw batch-{batch} (img/s)",
                    "",
                    1,
                    raw_measure(session, batch_feeds, batch),
                    agent,
                )
            ]
            served_plan = plan_cell(package, frame, backend.get("plan", {}), args.precision, agent)
            if served_plan is not None:
                cells.append(served_plan)
            if args.peers:
                model_file = pinned / package.variant("onnxruntime", args.precision).files[0]
                peers = await start_peers(args, model_file, package, Path(tmp), frame, progress)
                regions = ShmRegions(package, frame, max(args.concurrency))
                shm_bodies = await regions.register(daemon.sock)
                cells += peer_cells(args, package, frame, daemon, peers, shm_bodies)
            else:
                bodies = {m: b for m, b in requests_for(package, frame).items() if m in args.modes}
                cells += [
                    Cell(
                        "edgeagent",
                        mode,
                        "unix",
                        c,
                        served_measure(daemon.sock, url, body, headers, c),
                        agent,
                    )
                    for mode, (url, body, headers) in bodies.items()
                    for c in args.concurrency
                ]
            if args.only:
                cells = [c for c in cells if any(part in c.name for part in args.only)]
            tallies = [Tally() for _ in cells]
            samplers = {"edgeagent": PeakRss(process.pid)}
            samplers.update(
                {
                    label: PeakRss(p.pid)
                    for label, p in (("naive", peers.naive), ("MLServer", peers.mlserver))
                    if p is not None
                }
            )
            for sampler in samplers.values():
                sampler.__enter__()
            try:
                # Every cell once per round, the order reversed each round: drift of the
                # machine's speed during the run then touches every server alike.
                seconds = args.duration / args.rounds
                for index in range(args.rounds):
                    order = list(zip(cells, tallies, strict=True))
                    for cell, tally in order if index % 2 == 0 else order[::-1]:
                        await measure_round(cell, tally, session, feeds, seconds)
                        progress(
                            f"round {index + 1}/{args.rounds} {cell.name} c={cell.concurrency}: "
                            f"{tally.throughputs[-1]:.1f}/s p50 {tally.p50s[-1]:.2f} ms (raw "
                            f"{tally.raw_throughputs[-1]:.1f}/s p50 {tally.raw_p50s[-1]:.2f} ms)"
                        )
            finally:
                for sampler in samplers.values():
                    sampler.__exit__()
            session.close()
            if peers.mlserver is not None:  # last: MLServer answers nothing after this request
                feeds = {spec.name: frame}
                peers.notes.append(await probe_binary(peers.mlserver_port, package.name, feeds))
            rows = [cell_row(cell, tally) for cell, tally in zip(cells, tallies, strict=True)]
            all_raw = [value for tally in tallies for value in tally.raw_latencies]
            raw = summarize("raw batch-1", 1, all_raw, sum(t.raw_time for t in tallies), 0)
            runtimes = mapped_runtimes(process.pid)
        finally:
            if regions is not None:
                regions.close()
            for each in [process, *peers.processes()]:
                stop_tree(each)
    add_ratios(rows)
    binary = {
        r["concurrency"]: r
        for r in rows
        if r["server"] == "edgeagent" and r["mode"] == "v2 binary" and r["transport"] == "unix"
    }
    return {
        "model": package.name,
        "backend": f"{backend['runtime']} {backend['device']} {backend['precision']}",
        "cpus": len(os.sched_getaffinity(0)),
        "threads": args.threads,
        "duration_s": args.duration,
        "rounds": args.rounds,
        "peers": args.peers,
        "raw": raw,
        "raw_latencies": all_raw,
        "rows": rows,
        "ready_s": ready_s,
        "plan_settled_s": plan_s,
        "naive_ready_s": peers.naive_ready_s,
        "rss_idle_mb": rss_idle / 2**20,
        "rss_loaded_mb": samplers["edgeagent"].peak / 2**20,
        "peak_rss_mb": {k: v.peak / 2**20 for k, v in samplers.items()} if args.peers else {},
        "overhead_c1_ms": binary[1]["overhead_p50_ms"] if 1 in binary else float("nan"),
        "floor_p50_ms": next((r["p50_ms"] for r in rows if r["mode"] == FLOOR), float("nan")),
        "c16_ratio": binary[16]["ratio"] if 16 in binary else float("nan"),
        "plan": backend.get("plan"),
        "c16_over_plan": served_over_plan(rows, binary.get(16)),
        "runtimes_mapped": runtimes,
        "notes": peers.notes or [],
        "exit_code": process.returncode,
    }


def one_path_options(description: str, seconds: float, rounds: int) -> argparse.ArgumentParser:
    """The options of the benchmarks that drive one path of one daemon (bench_busy, bench_ab)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", type=Path, default=zoo_dir() / "mobilenet_v2")
    parser.add_argument("--precision", default="int8")
    parser.add_argument("--mode", default="v2 JSON", choices=["v2 binary", "v2 JSON"])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2, help="[hardware] threads (0: all)")
    parser.add_argument("--seconds", type=float, default=seconds, help="per round")
    parser.add_argument("--rounds", type=int, default=rounds)
    return parser


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=zoo_dir() / "mobilenet_v2")
    parser.add_argument(
        "--duration", "--seconds", type=float, default=5.0, help="seconds per cell, all rounds"
    )
    parser.add_argument(
        "--precision", default="int8", help="the onnxruntime variant both sides run (int8)"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="intra-op threads on every side ([hardware] threads); 0 = every core",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=4,
        help="rounds of every cell, each after a raw batch-1 round; figures are medians (drift)",
    )
    parser.add_argument(
        "--concurrency", type=lambda s: [int(c) for c in s.split(",")], default=[1, 4, 16]
    )
    parser.add_argument(
        "--modes",
        type=lambda s: s.split(","),
        default=["v2 binary", "v2 JSON", "classify JPEG"],
        help="comma-separated subset of: v2 binary, v2 JSON, classify JPEG (without --peers)",
    )
    parser.add_argument(
        "--peers",
        action="store_true",
        help="also the naive server and MLServer, and edgeagent over TCP, gRPC and shm",
    )
    parser.add_argument(
        "--skip-mlserver", action="store_true", help="with --peers: leave MLServer out"
    )
    parser.add_argument(
        "--only",
        type=lambda s: s.split(","),
        default=[],
        help="measure only the cells whose path name holds one of these comma-separated parts "
        "(e.g. 'JSON'): fewer cells, so a server and its peer run closer together in time",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--plot", type=Path, metavar="PNG", help="write the latency distributions per path"
    )
    args = parser.parse_args()
    report = asyncio.run(run(args))
    if args.plot:
        plot(report, args.plot)
        progress(f"plot written to {args.plot}")
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
