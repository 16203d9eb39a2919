#!/usr/bin/env python3
"""Several boards as one: a hot board's overflow on its peer, a peer lost mid-run, an idle peer.

Two agents on loopback, each a simulated device of known speed (``devtools.simulated_runtime``:
the tiny model's real outputs, the rest of the device's service time waited out) behind the
agent's own engine; the peer is a separate process serving the v2 HTTP API with a token, as
another board on the site would. The local board's governor reads the thermal simulator, heated
by the local device's measured busy time. Three scenarios, each in alternating paired rounds:

* **hot**: requests arrive open-loop at twice the local board's capacity (``--hot-rate``) while
  its governor throttles it. Rounds alternate the local board alone (what a hot board answered
  before: 503s) and with the peer, beside unthrottled rounds of both boards (no governor) at
  the same rate: errors, throughput against the two boards' unthrottled capacity, p95 against
  unthrottled.
* **kill**: the peer process is killed (SIGKILL) mid-run under a load the local board can carry
  alone: the time from the kill until the peer is out of the rotation, requests failed, and
  answers against requests (each request is answered once or fails once: never twice).
* **idle**: one client at a time (c=1) with a peer 10 ms away (a delay before the peer handles
  each request) against the local board alone: p50 ratio (a fast local device is never slowed).

Run ``python scripts/bench_site.py`` (add ``--json`` for the report the docs quote); its run
takes about two minutes. ``python scripts/bench_site.py peer …`` is the peer process itself.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
from prometheus_client import CollectorRegistry

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from devtools.background import WatchedTasks  # noqa: E402
from devtools.package import read_model_toml, write_model_toml  # noqa: E402
from devtools.simulated_runtime import SimulatedRuntime  # noqa: E402
from devtools.tiny import write_tiny_package  # noqa: E402
from edgeagent.engine.busy_counter import LoadCounter  # noqa: E402
from edgeagent.engine.errors import ServingError  # noqa: E402
from edgeagent.engine.limits import UNTHROTTLED, ServingLimits  # noqa: E402
from edgeagent.engine.metrics import EngineMetrics  # noqa: E402
from edgeagent.engine.registry import ModelRegistry  # noqa: E402
from edgeagent.engine.serving import LoadedModel, ModelFactory  # noqa: E402
from edgeagent.engine.settings import EngineSettings  # noqa: E402
from edgeagent.governor.service import GovernorService  # noqa: E402
from edgeagent.governor.settings import GovernorSettings  # noqa: E402
from edgeagent.hardware.instances import InstanceGroup  # noqa: E402
from edgeagent.hardware.peers import PeerSettings  # noqa: E402
from edgeagent.hardware.profile import load_profiles  # noqa: E402
from edgeagent.hardware.service import Accelerators  # noqa: E402
from edgeagent.hardware.settings import HardwareSettings  # noqa: E402
from edgeagent.runtimes.remote import PeerState, RemoteSession  # noqa: E402

FIXTURES = REPO / "tests" / "fixtures" / "boards" / "generic-x86_64"
LIMIT_C = 70.0


# ---------------------------------------------------------------------------------------------
# One board: a simulated device serving the tiny model through the agent's engine


def write_board(work: Path) -> tuple[Path, Path]:
    """The tiny package (batches of one row: capacity is 1 / service time) and a profile
    whose one candidate is the simulated device SIM0."""
    root = write_tiny_package(work / "models" / "tiny")
    data = read_model_toml(root)
    data["serving"] = {"max_batch_size": 1, "plan": "fixed", "instances": 1}
    write_model_toml(root, data)
    profiles = work / "profiles"
    profiles.mkdir(parents=True, exist_ok=True)
    (profiles / "sim.toml").write_text(
        'name = "sim"\narch = "any"\ngeneric = true\n[[candidate]]\nruntime = "onnxruntime"\n'
        'device = "SIM0"\nprecision = "fp32"\npower = "high"\n'
    )
    return root, profiles


async def open_board(
    work: Path,
    device_s: float,
    *,
    peers: tuple[PeerSettings, ...] = (),
    limits: Callable[[], ServingLimits] = lambda: UNTHROTTLED,
    load: LoadCounter | None = None,
    executor: ThreadPoolExecutor,
    metrics: CollectorRegistry | None = None,
) -> ModelRegistry:
    SimulatedRuntime({"SIM0": device_s}).install()
    root, profiles = write_board(work)
    hardware = Accelerators(
        HardwareSettings(root=FIXTURES, profiles_dir=profiles, profile="sim"),
        work / "state",
        peers=peers,
    )
    settings = EngineSettings(cache_size=0, max_queue=64, request_timeout_s=10.0)
    factory = ModelFactory(
        settings,
        executor=executor,
        metrics=EngineMetrics(metrics or CollectorRegistry()),
        load=load or LoadCounter(),
        limits_provider=limits,
    )
    registry = ModelRegistry(hardware.open, factory.build, settings=settings, executor=executor)
    registry.add(root)
    await registry.load_all()
    return registry


def serve_peer(args: argparse.Namespace) -> int:
    """The peer: a board serving v2 HTTP on a loopback port (printed) until killed; with
    ``--delay-ms`` every request waits that long first (a board that far away)."""
    from aiohttp import web

    from edgeagent.api.http.app import create_app
    from edgeagent.api.listeners import handler_args, tcp_site
    from edgeagent.api.settings import ServerSettings
    from edgeagent.engine.dataplane import DataPlane

    async def main() -> None:
        metrics = CollectorRegistry()
        executor = ThreadPoolExecutor(4)
        registry = await open_board(
            Path(args.dir), args.device_ms / 1e3, executor=executor, metrics=metrics
        )
        settings = ServerSettings(tcp_port=0, token=args.token, unix_socket=Path(args.dir) / "s")
        engine = EngineSettings()
        app = create_app(
            DataPlane(registry, engine, EngineMetrics(CollectorRegistry())),
            settings=settings,
            metrics=metrics,
            status=lambda: {"models": registry.status()},
        )
        if args.delay_ms > 0:

            @web.middleware
            async def away(request: web.Request, handler):  # type: ignore[no-untyped-def]
                await asyncio.sleep(args.delay_ms / 1e3)
                return await handler(request)

            app.middlewares.insert(0, away)
        runner = web.AppRunner(app, access_log=None, **handler_args(settings))
        await runner.setup()
        site = tcp_site(runner, "127.0.0.1", 0, settings)
        await site.start()
        print(f"port {site.sockets[0].getsockname()[1]}", flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())
    return 0


class Peer:
    """The peer process: started, its URL, and killed (SIGKILL, as a board losing power)."""

    def __init__(self, work: Path, device_ms: float, delay_ms: float = 0.0) -> None:
        self.token = secrets.token_hex(8)
        work.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [sys.executable, __file__, "peer", "--dir", str(work), "--device-ms", str(device_ms),
             "--delay-ms", str(delay_ms), "--token", self.token],
            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)},
        )  # fmt: skip
        assert self.process.stdout is not None
        line = self.process.stdout.readline()  # the peer's first line: its port
        if not line.startswith("port "):
            raise SystemExit(f"the peer did not start (exit {self.process.wait()})")
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"

    def settings(self, **keys: object) -> PeerSettings:
        return PeerSettings(url=self.url, token=self.token, name="peer", **keys)  # type: ignore[arg-type]

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)


# ---------------------------------------------------------------------------------------------
# Load and its figures


class Load:
    """Open-loop arrivals at ``rate``/s for ``seconds``: each request's latency or failure."""

    def __init__(self, model: LoadedModel) -> None:
        self.model = model
        self.x = np.random.default_rng(1).standard_normal((1, 3, 8, 8)).astype(np.float32)
        self.latencies: list[float] = []
        self.errors = 0
        self.kinds: dict[str, int] = {}
        self.answered_at: list[float] = []

    async def one(self) -> None:
        began = time.monotonic()
        try:
            await self.model.infer({"input": self.x})
        except ServingError as exc:
            self.errors += 1
            self.kinds[type(exc).__name__] = self.kinds.get(type(exc).__name__, 0) + 1
            return
        self.answered_at.append(time.monotonic())
        self.latencies.append(time.monotonic() - began)

    async def offer(self, rate: float, seconds: float, at: Callable[[float], None] | None = None):
        async with WatchedTasks() as tasks:
            start, sent = time.monotonic(), 0
            running = []
            while (elapsed := time.monotonic() - start) < seconds:
                if at is not None:
                    at(elapsed)
                while sent < int(elapsed * rate) + 1:
                    running.append(tasks.spawn(self.one(), name=f"request {sent}"))
                    sent += 1
                await asyncio.sleep(0.002)
            await asyncio.gather(*running)
        return sent, start


def p(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def peer_state(model: LoadedModel) -> PeerState | None:
    group = model.session
    if isinstance(group, InstanceGroup):
        for instance in group.scheduler.instances:
            if isinstance(instance.session, RemoteSession):
                return instance.session.state
    return None


def peer_batches(model: LoadedModel) -> int:
    """Batches the model's peer lanes ran (0 without any)."""
    group = model.session
    if not isinstance(group, InstanceGroup):
        return 0
    instances = group.scheduler.instances
    return sum(i.batches for i in instances if isinstance(i.session, RemoteSession))


# ---------------------------------------------------------------------------------------------
# Scenarios


async def hot_round(args, work: Path, peer: Peer | None, governed: bool, executor) -> dict:
    """One round at twice the local capacity: with ``governed``, the thermal simulator's
    governor throttles the local board (pre-heated to its limit); with ``peer``, it helps."""
    load_counter = LoadCounter()
    governor = None
    limits: Callable[[], ServingLimits] = lambda: UNTHROTTLED  # noqa: E731
    if governed:
        settings = GovernorSettings(
            simulate=True, sim_root=work / "sim", interval_s=0.1, sim_ambient_c=40.0,
            sim_heat_c=args.heat, sim_tau_s=args.tau, sim_noise_c=0.0,
            sim_warm_c=LIMIT_C - 10, sim_hot_c=LIMIT_C, sim_critical_c=LIMIT_C + 10,
        )  # fmt: skip
        generic = next(p for p in load_profiles() if p.generic)
        governor = GovernorService(
            settings, generic, Path("/"), CollectorRegistry(), load=load_counter
        )
        limits = governor.limits
    peers = (peer.settings(concurrency=args.peer_concurrency),) if peer is not None else ()
    registry = await open_board(
        work, args.device_ms / 1e3, peers=peers, limits=limits, load=load_counter,
        executor=executor,
    )  # fmt: skip
    try:
        model = registry.get("tiny")
        if governor is not None:
            assert governor.simulator is not None
            governor.simulator.temperature_c = LIMIT_C  # a board that is hot already
            governor.simulator.step(0.0, 1.0)  # written to its zone before the first read
            await governor.start()
        load = Load(model)
        rate = args.hot_rate * 1e3 / args.device_ms
        _, start = await load.offer(rate, args.seconds)
        warm = start + args.seconds * 0.25  # throughput over the last three quarters
        done = sum(1 for t in load.answered_at if warm <= t <= start + args.seconds)
        return {
            "errors": load.errors,
            "failures": load.kinds,
            "peer_batches": peer_batches(model),
            "per_s": done / (args.seconds * 0.75),
            "p95_ms": p(load.latencies, 95) * 1e3,
            "state": governor.policy.state.label if governor is not None else "unthrottled",
        }
    finally:
        if governor is not None:
            await governor.stop()
        await registry.close()


async def hot(args, work: Path, executor) -> dict:
    peer = Peer(work / "peer-hot", args.device_ms)
    rounds: dict[str, list[dict]] = {"alone": [], "with_peer": [], "unthrottled": []}
    try:
        for index in range(args.rounds):
            order = [
                ("unthrottled", True, False),
                ("alone", False, True),
                ("with_peer", True, True),
            ]
            if index % 2:
                order.reverse()  # alternate, so a drift of the machine hits each alike
            for key, with_peer, governed in order:
                where = work / f"hot-{index}-{key}"
                figures = await hot_round(
                    args, where, peer if with_peer else None, governed, executor
                )
                rounds[key].append(figures)
    finally:
        peer.kill()
    capacity = 2 * 1e3 / args.device_ms  # the two boards' unthrottled sum
    offered = args.hot_rate * 1e3 / args.device_ms
    medians = {
        key: {f: statistics.median(r[f] for r in rows) for f in ("errors", "per_s", "p95_ms")}
        for key, rows in rounds.items()
    }
    # The most the pair can deliver: the peer flat out, and the hot board at what its governor
    # lets it deliver (its rounds alone).
    achievable = 1e3 / args.device_ms + medians["alone"]["per_s"]
    return {
        "offered_per_s": offered,
        "unthrottled_sum_per_s": capacity,
        "rounds": rounds,
        "median": medians,
        "errors_alone": sum(r["errors"] for r in rounds["alone"]),
        "errors_with_peer": sum(r["errors"] for r in rounds["with_peer"]),
        "throughput_ratio": medians["with_peer"]["per_s"] / capacity,
        "achievable_per_s": achievable,
        "throughput_vs_achievable": medians["with_peer"]["per_s"] / achievable,
        "throughput_vs_offered": medians["with_peer"]["per_s"] / offered,
        "p95_ratio": medians["with_peer"]["p95_ms"] / medians["unthrottled"]["p95_ms"],
    }


async def kill_round(args, work: Path, index: int, executor) -> dict:
    """One run whose peer — four times as fast, so it serves most requests — is killed
    halfway; the local board can carry the load alone."""
    peer = Peer(work / f"peer-kill-{index}", args.device_ms / 4)
    peers = (peer.settings(concurrency=args.peer_concurrency),)
    registry = await open_board(
        work / f"kill-{index}", args.device_ms / 1e3, peers=peers, executor=executor
    )
    try:
        model = registry.get("tiny")
        state = peer_state(model)
        assert state is not None and state.up
        load = Load(model)
        killed: list[float] = []

        def at(elapsed: float) -> None:
            if elapsed >= args.seconds / 2 and not killed:
                killed.append(time.monotonic())
                peer.kill()

        sent, _ = await load.offer(0.7 * 1e3 / args.device_ms, args.seconds, at)
        out = await asyncio.get_running_loop().run_in_executor(
            None, state.wait_for, lambda s: not s.up, 10.0
        )
        answers = len(load.latencies)
        return {
            "sent": sent,
            "answered": answers,
            "failed": load.errors,
            "failures": load.kinds,
            "peer_batches": peer_batches(model),
            "lost": sent - answers - load.errors,
            "answered_twice": max(0, answers + load.errors - sent),
            "out_of_rotation": bool(out),
            "back_to_local_s": (state.down_since or killed[0]) - killed[0],
        }
    finally:
        peer.kill()
        await registry.close()


async def kill(args, work: Path, executor) -> dict:
    """The peer killed mid-run, in ``rounds`` runs."""
    results = [await kill_round(args, work, index, executor) for index in range(args.rounds)]
    return {
        "rounds": results,
        "failed": sum(r["failed"] for r in results),
        "lost": sum(r["lost"] for r in results),
        "answered_twice": sum(r["answered_twice"] for r in results),
        "back_to_local_s_max": max(r["back_to_local_s"] for r in results),
    }


async def idle(args, work: Path, executor) -> dict:
    """c=1 with a peer 10 ms away against the local board alone, rounds alternating."""
    peer = Peer(work / "peer-idle", args.fast_ms, delay_ms=args.delay_ms)
    boards = {
        "alone": await open_board(work / "idle-alone", args.fast_ms / 1e3, executor=executor),
        "with_peer": await open_board(
            work / "idle-peer", args.fast_ms / 1e3, peers=(peer.settings(),), executor=executor
        ),
    }
    p50: dict[str, list[float]] = {key: [] for key in boards}
    x = np.zeros((1, 3, 8, 8), np.float32)
    try:
        for index in range(args.rounds * 2):
            keys = list(boards) if index % 2 == 0 else list(reversed(boards))
            for key in keys:
                model = boards[key].get("tiny")
                latencies = []
                for _ in range(args.requests):
                    began = time.monotonic()
                    await model.infer({"input": x})
                    latencies.append(time.monotonic() - began)
                p50[key].append(statistics.median(latencies) * 1e3)
        state = peer_state(boards["with_peer"].get("tiny"))
        remote = peer_batches(boards["with_peer"].get("tiny"))
    finally:
        peer.kill()
        for registry in boards.values():
            await registry.close()
    ratios = [w / a for w, a in zip(p50["with_peer"], p50["alone"], strict=True)]
    return {
        "delay_ms": args.delay_ms,
        "device_ms": args.fast_ms,
        "p50_ms": {key: statistics.median(v) for key, v in p50.items()},
        "p50_ratio": statistics.median(ratios),
        "batches_sent_to_peer": remote,
        "peer_in_rotation": bool(state and state.up),
    }


async def run(args: argparse.Namespace) -> dict:
    work = Path(tempfile.mkdtemp(prefix="bench-site-"))
    report: dict = {"device_ms": args.device_ms, "rounds": args.rounds, "seconds": args.seconds}
    with ThreadPoolExecutor(8) as executor:
        for name in args.only or ("hot", "kill", "idle"):
            report[name] = await {"hot": hot, "kill": kill, "idle": idle}[name](
                args, work, executor
            )
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    peer = sub.add_parser("peer", help="run the peer board until killed (the bench starts it)")
    peer.add_argument("--dir", required=True)
    peer.add_argument("--device-ms", type=float, required=True)
    peer.add_argument("--delay-ms", type=float, default=0.0)
    peer.add_argument("--token", required=True)
    parser.add_argument("--device-ms", type=float, default=50.0, help="each board's batch time")
    parser.add_argument("--fast-ms", type=float, default=2.0, help="the idle scenario's device")
    parser.add_argument("--delay-ms", type=float, default=10.0, help="how far the idle peer is")
    parser.add_argument("--seconds", type=float, default=8.0, help="one round of hot and kill")
    parser.add_argument("--requests", type=int, default=100, help="one c=1 round of idle")
    parser.add_argument("--rounds", type=int, default=3, help="paired rounds per scenario")
    parser.add_argument(
        "--hot-rate", type=float, default=2.0, help="hot: offered load, × one board's capacity"
    )
    parser.add_argument("--heat", type=float, default=60.0, help="simulator: °C at full load")
    parser.add_argument("--tau", type=float, default=1.0, help="simulator: time constant, s")
    parser.add_argument(
        "--peer-concurrency", type=int, default=4, help="[[peer]] concurrency (hot, kill)"
    )
    parser.add_argument("--only", nargs="+", choices=("hot", "kill", "idle"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if args.command == "peer":
        return serve_peer(args)
    report = asyncio.run(run(args))
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(json.dumps({k: v for k, v in report.items() if k != "hot"}, indent=2))
        hot_report = report.get("hot")
        if hot_report:
            print(json.dumps({k: v for k, v in hot_report.items() if k != "rounds"}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
