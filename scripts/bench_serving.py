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
import contextlib
import io
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from multiprocessing import shared_memory
from pathlib import Path

import aiohttp
import numpy as np
import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import bench_peers  # noqa: E402

from devtools.package import keep_variants  # noqa: E402
from devtools.ports import free_port  # noqa: E402
from devtools.waiting import until  # noqa: E402
from devtools.zoo import zoo_dir  # noqa: E402
from edgeagent.api.v2 import HEADER_LENGTH, encode_request  # noqa: E402
from edgeagent.hardware.plan_search import PlanShape, closed_loop  # noqa: E402
from edgeagent.models.device_key import open_device_key  # noqa: E402
from edgeagent.models.package import load_package  # noqa: E402
from edgeagent.models.session import open_variant  # noqa: E402

TARGET_IDLE_RSS_MB = 100  # issue 15
TARGET_OVERHEAD_MS = 0.3  # issue 15: the naive server's overhead


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


# Where a server listens for HTTP: its Unix socket, or a TCP port on 127.0.0.1.
Endpoint = Path | int


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


def http_client(endpoint: Endpoint, limit: int = 100) -> aiohttp.ClientSession:
    """A client session on the endpoint; request URLs are paths (``/v2/...``)."""
    if isinstance(endpoint, Path):
        connector: aiohttp.BaseConnector = aiohttp.UnixConnector(path=str(endpoint), limit=limit)
        return aiohttp.ClientSession("http://agent", connector=connector)
    connector = aiohttp.TCPConnector(limit=limit)
    return aiohttp.ClientSession(f"http://127.0.0.1:{endpoint}", connector=connector)


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


async def wait_ready(sock: Path, process: subprocess.Popen, timeout: float = 300) -> dict:
    """The daemon's /v1/status once it is ready; SystemExit when it exits or a model fails."""
    status: dict = {}

    async def ready() -> bool:
        if process.poll() is not None:
            raise SystemExit(f"the daemon exited with {process.returncode}")
        try:
            async with http_client(sock) as client:
                async with client.get("/v2/health/ready") as response:
                    if response.status == 200:
                        async with client.get("/v1/status") as answer:
                            status.update(await answer.json())
                        return True
                async with client.post("/v2/repository/index") as index:
                    failed = [m for m in await index.json() if m["state"] == "UNAVAILABLE"]
                if failed:  # it listens only after loading: this model will not come
                    raise SystemExit(f"the daemon could not load a model: {failed}")
        except (aiohttp.ClientError, OSError):
            pass
        return False

    try:
        await until(ready, timeout, poll_s=0.02)  # fine enough to time start → ready
    except AssertionError:
        raise SystemExit("the daemon did not become ready") from None
    return status


async def wait_plan(sock: Path, model: str, timeout: float = 120) -> dict:
    """The daemon's /v1/status once ``model``'s execution plan is no longer pending (the
    search after serving has swapped its plan in): what the measured rows must run on."""
    status: dict = {}

    async def settled() -> bool:
        async with http_client(sock) as client, client.get("/v1/status") as answer:
            status.clear()
            status.update(await answer.json())
        versions = status["models"][model]["versions"]
        return all(v.get("plan", {}).get("source") != "pending" for v in versions.values())

    try:
        await until(settled, timeout, poll_s=0.02)
    except AssertionError:
        raise SystemExit("the daemon's execution plan search did not end") from None
    return status


async def wait_http(endpoint: Endpoint, path: str, process: subprocess.Popen, what: str) -> None:
    """Poll ``path`` until it answers 200 (peers start in seconds; MLServer in ~10)."""

    async def answers() -> bool:
        if process.poll() is not None:
            stderr = process.stderr.read() if process.stderr else ""
            raise SystemExit(f"{what} exited with {process.returncode}: {stderr[-2000:]}")
        try:
            async with http_client(endpoint) as client, client.get(path) as response:
                return response.status == 200
        except (aiohttp.ClientError, OSError):
            return False

    try:
        await until(answers, 120, poll_s=0.02)
    except AssertionError:
        raise SystemExit(f"{what} did not become ready") from None


def stop_tree(process: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL for the process and its children (MLServer's workers) if it hangs."""
    try:
        children = psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    process.terminate()
    try:
        process.wait(30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
    for child in children:  # orphaned workers of a server that died or hung
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()


def pinned_package(
    package_dir: Path, precision: str, target: Path, runtime: str = "onnxruntime"
) -> Path:
    """A copy of the package that offers only its ``runtime`` ``precision`` variant.

    The daemon picks the device's best candidate (LiteRT or OpenVINO may rank first); the
    comparison is one variant against itself, so the served package has nothing else to pick.
    model.toml keeps every table except the other [[variant]] blocks; files are copied (a
    package refuses symlinks that point outside it).
    """
    package = load_package(package_dir)
    chosen = package.variant(runtime, precision)
    if chosen is None:
        raise SystemExit(f"{package_dir} has no {runtime} {precision} variant")
    others = {f for v in package.variants if v is not chosen for f in v.files}
    target.mkdir(parents=True)
    for path in package.root.iterdir():
        if path.is_file() and path not in others:
            shutil.copyfile(path, target / path.name)
    keep_variants(target, lambda v: v["runtime"] == runtime and v["precision"] == precision)
    return target


@dataclass
class Daemon:
    """The edgeagent daemon under test and where it listens."""

    process: subprocess.Popen
    sock: Path
    tcp_port: int  # 0: no TCP listener
    grpc_port: int  # 0: no gRPC
    grpc_sock: Path
    token: str  # [server] token: what TCP requests (HTTP and gRPC) must carry


def start_daemon(
    package_dir: Path, work: Path, threads: int, peers: bool = False, server: str = ""
) -> Daemon:
    """``edgeagent run`` on just this package; ``threads`` = [hardware] threads (0: all cores).

    With ``peers`` it also listens on TCP and serves gRPC (TCP and its own Unix socket);
    ``server`` holds extra lines of its [server] table.
    """
    tcp_port = free_port() if peers else 0
    grpc_port = free_port() if peers else 0
    grpc_sock = work / "grpc.sock"
    config = work / "agent.toml"
    token = secrets.token_hex(16)
    text = f"[hardware]\nthreads = {threads}\n[server]\ntoken = '{token}'\n"
    if server:
        text += f"{server}\n"
    if peers:
        text += f"[grpc]\nenabled = true\nport = {grpc_port}\nunix_socket = '{grpc_sock}'\n"
    config.write_text(text)
    models = work / "models"
    models.mkdir()
    (models / package_dir.name).symlink_to(package_dir.resolve())
    sock = work / "agent.sock"
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "PYTHONPATH": path, "XDG_STATE_HOME": str(work / "state")}
    # A provisioned device: its key pair exists. Only the first start creates it, and that
    # start alone loads the crypto library (7 MB) that an agent without sealed models needs not.
    open_device_key(work / "state" / "edgeagent")
    command = [sys.executable, "-m", "edgeagent.cli", "run", "--config", str(config)]
    command += ["--models-dir", str(models)]
    command += ["--socket", str(sock), "--port", str(tcp_port)]
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=work
    )
    return Daemon(process, sock, tcp_port, grpc_port, grpc_sock, token)


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
    from edgeagent.api.proto import inference_pb2 as pb

    spec = package.inputs[0]
    request = pb.ModelInferRequest(model_name=package.name)
    request.inputs.add(name=spec.name, datatype="FP32", shape=frame.shape)
    request.raw_input_contents.append(frame.tobytes())
    return request.SerializeToString()


class ShmRegions:
    """One input region holding the frame and one output region per client worker."""

    def __init__(self, package, frame: np.ndarray, workers: int) -> None:
        self.package = package
        self.input = shared_memory.SharedMemory(create=True, size=frame.nbytes)
        np.ndarray(frame.shape, frame.dtype, buffer=self.input.buf)[...] = frame
        self.shape = list(frame.shape)
        self.output_bytes = 4 * int(np.prod([1, *package.outputs[0].shape[1:]]))
        self.outputs = [
            shared_memory.SharedMemory(create=True, size=self.output_bytes) for _ in range(workers)
        ]

    async def register(self, sock: Path) -> list[bytes]:
        """Register every region with the daemon; the infer body of each worker."""
        regions = [("bench-in", self.input)] + [
            (f"bench-out-{i}", region) for i, region in enumerate(self.outputs)
        ]
        async with http_client(sock) as client:
            for name, region in regions:
                body = {"key": "/" + region.name, "offset": 0, "byte_size": region.size}
                url = f"/v2/systemsharedmemory/region/{name}/register"
                async with client.post(url, json=body) as response:
                    if response.status != 200:
                        raise SystemExit(f"{url}: {response.status} {await response.text()}")
        spec = self.package.inputs[0]
        return [
            json.dumps(
                {
                    "inputs": [
                        {
                            "name": spec.name,
                            "shape": self.shape,
                            "datatype": "FP32",
                            "parameters": {
                                "shared_memory_region": "bench-in",
                                "shared_memory_byte_size": self.input.size,
                            },
                        }
                    ],
                    "outputs": [
                        {
                            "name": self.package.outputs[0].name,
                            "parameters": {
                                "shared_memory_region": f"bench-out-{i}",
                                "shared_memory_byte_size": self.output_bytes,
                            },
                        }
                    ],
                }
            ).encode()
            for i in range(len(self.outputs))
        ]

    def close(self) -> None:
        for region in [self.input, *self.outputs]:
            region.close()
            region.unlink()


@dataclass
class Peers:
    """The peer servers of one --peers run (each None when it could not start) and why not."""

    naive: subprocess.Popen | None = None
    naive_sock: Path | None = None
    naive_port: int = 0
    naive_ready_s: float = float("nan")  # start → ready (model loaded, listening)
    mlserver: subprocess.Popen | None = None
    mlserver_port: int = 0
    notes: list[str] | None = None

    def processes(self) -> list[subprocess.Popen]:
        return [p for p in (self.naive, self.mlserver) if p is not None]


async def start_peers(args, model_file: Path, package, work: Path, frame: np.ndarray) -> Peers:
    """Start the naive server and MLServer; a peer that fails to start stops the others."""
    peers = Peers(notes=[])
    try:
        await _start_peers(peers, args, model_file, package, work, frame)
    except BaseException:
        for each in peers.processes():
            stop_tree(each)
        raise
    return peers


async def _start_peers(peers: Peers, args, model_file: Path, package, work: Path, frame) -> None:
    name = package.name
    peers.naive_sock = work / "naive.sock"
    peers.naive_port = free_port()
    command = [sys.executable, str(Path(bench_peers.__file__)), "naive", "--model", str(model_file)]
    command += ["--name", name, "--threads", str(args.threads), "--socket", str(peers.naive_sock)]
    command += ["--port", str(peers.naive_port)]
    started = time.perf_counter()
    peers.naive = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    await wait_http(peers.naive_sock, "/v2/health/ready", peers.naive, "the naive server")
    peers.naive_ready_s = time.perf_counter() - started
    if args.skip_mlserver:
        peers.notes.append("MLServer skipped (--skip-mlserver)")
        return
    binary = bench_peers.mlserver_venv(progress)
    if isinstance(binary, str):
        peers.notes.append(binary)
        progress(binary)
        return
    peers.mlserver_port = free_port()
    peers.mlserver = bench_peers.start_mlserver(
        binary, work, model_file, name, args.threads, peers.mlserver_port, free_port()
    )
    try:
        await wait_http(peers.mlserver_port, f"/v2/models/{name}/ready", peers.mlserver, "MLServer")
    except SystemExit as exc:  # the other servers are still worth measuring
        peers.notes.append(f"MLServer left out: {str(exc)[-300:]}")
        progress(peers.notes[-1])
        stop_tree(peers.mlserver)
        peers.mlserver = None


async def probe_binary(port: int, name: str, feeds: dict[str, np.ndarray]) -> str:
    """Whether MLServer answers the binary tensor extension; never benchmarked, since 1.7.1
    answers nothing to it and, from then on, nothing to JSON requests either."""
    body, length = encode_request(feeds, binary=True)
    headers = {HEADER_LENGTH: str(length)}
    try:
        async with (
            http_client(port) as client,
            client.post(
                f"/v2/models/{name}/infer",
                data=body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=10),
            ) as response,
        ):
            answer = f"HTTP {response.status}: {(await response.text())[:200]}"
    except (TimeoutError, aiohttp.ClientError) as exc:
        answer = f"no answer ({type(exc).__name__})"
    return f"MLServer, one v2 binary request (not benchmarked): {answer}"


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


def _ratio(row: dict, key: str) -> str:
    return f"{row[key]:.2f}" if key in row else ""


def markdown(report: dict) -> str:
    raw = report["raw"]
    peers = bool(report.get("peers"))
    extra_head = " × naive | × MLServer |" if peers else ""
    extra_rule = "---:|---:|" if peers else ""
    lines = [
        f"Model {report['model']} ({report['backend']}), {report['cpus']} CPUs, "
        f"intra-op threads {report['threads'] or 'all cores'}, "
        f"{report['duration_s']:g} s per cell in {report['rounds']} rounds of every cell, each "
        "after a raw batch-1 round; req/s, p50 and ratios are medians of the rounds",
        "",
        "| path | concurrency | req/s | p50 ms | p99 ms | errors | raw req/s (same rounds) "
        "| × raw | p50 − raw p50 ms | server CPU ms/req | client CPU ms/req |" + extra_head,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + extra_rule,
        f"| raw batch-1 (all rounds) | 1 | {raw['throughput']:.1f} | {raw['p50_ms']:.2f} | "
        f"{raw['p99_ms']:.2f} | 0 | | | | | |" + (" | |" if peers else ""),
    ]
    for row in report["rows"]:
        ratios = f" {_ratio(row, 'x_naive')} | {_ratio(row, 'x_mlserver')} |" if peers else ""
        lines.append(
            f"| {row['mode'] if not peers else row['name']} | {row['concurrency']} | "
            f"{row['throughput']:.1f} | "
            f"{row['p50_ms']:.2f} | {row['p99_ms']:.2f} | {row['errors']} | "
            f"{row['raw_throughput']:.1f} | {row['ratio']:.2f} | {row['overhead_p50_ms']:+.2f} | "
            f"{row['daemon_cpu_ms']:.2f} | {row['client_cpu_ms']:.2f} |" + ratios
        )
    lines += [
        "",
        f"Daemon RSS idle (model loaded): {report['rss_idle_mb']:.0f} MB "
        f"(target ≤ {TARGET_IDLE_RSS_MB}); peak under load: {report['rss_loaded_mb']:.0f} MB; "
        f"runtimes mapped: {', '.join(report['runtimes_mapped'])}",
        f"p50 overhead at c=1, v2 binary vs raw: {report['overhead_c1_ms']:.2f} ms "
        f"(target ≤ {TARGET_OVERHEAD_MS})",
        f"v2 binary c=16 throughput / raw batch-1: {report['c16_ratio']:.2f} (target ≥ 1)",
        f"v2 binary c=16 throughput / the served plan in process: {report['c16_over_plan']:.2f}",
    ]
    if report["floor_p50_ms"] == report["floor_p50_ms"]:  # measured (not NaN)
        lines.append(
            f"HTTP floor at c=1 (the naive server answering without its model): p50 "
            f"{report['floor_p50_ms']:.2f} ms, the least any served p50 adds to raw here"
        )
    for server, peak in report.get("peak_rss_mb", {}).items():
        lines.append(f"Peak RSS under load, {server}: {peak:.0f} MB")
    naive = report["naive_ready_s"]
    lines.append(
        f"Start → ready on a fresh state: edgeagent {report['ready_s']:.2f} s (its execution "
        f"plan measured at {report['plan_settled_s']:.2f} s)"
        + (f", the naive server {naive:.2f} s" if naive == naive else "")
    )
    lines += report.get("notes", [])
    return "\n".join(lines)


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
                peers = await start_peers(args, model_file, package, Path(tmp), frame)
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


def plot(report: dict, path: Path) -> None:
    """Box plots of the latencies of every cell (log scale), raw batch-1 first."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["rows"]
    labels = ["raw batch-1"] + [f"{r['name']}\nc={r['concurrency']}" for r in rows]
    data = [report["raw_latencies"]] + [r["_latencies"] for r in rows]
    figure, axes = plt.subplots(figsize=(max(8, len(labels) * 0.9), 5))
    axes.boxplot([[v * 1e3 for v in d] or [float("nan")] for d in data], showfliers=False)
    axes.set_xticks(range(1, len(labels) + 1), labels, fontsize=7, rotation=90)
    axes.set_yscale("log")
    axes.set_ylabel("latency per request (ms, log scale)")
    axes.set_title(f"{report['model']} on {report['backend']}: raw in-process vs served")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    progress(f"plot written to {path}")


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
