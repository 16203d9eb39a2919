#!/usr/bin/env python3
"""Benchmark a signed model update end to end on loopback, under load.

What it measures:

- **publish → serving**: from the moment the hub publishes a signed release of the whole
  MobileNetV3-Small package (ONNX, LiteRT and OpenVINO at fp32 and int8, labels, golden
  inputs) until the agent's HTTP API reports the new version — verify, download, hash,
  unpack, install, load, warm, golden check, hot swap;
- **bytes per device** (release format 2): what the device downloaded (the shared files plus
  the variants it lists in ``variants.installed``, sizes from the signed manifest) against
  every artifact of the release — what release format 1 made every device download — and
  against what it needs (``hub.sign.device_needs``: its variants' files, model.toml, labels,
  golden inputs; the goal is at most 1.05×) and against what the variant it then
  serves needs — on its **first release** too (the agent starts with no model, so 1.0.0 is
  installed before anything was probed there) — for the benched model and, without
  running anything, for every variant of the zoo's detector (``--bytes-model``);
- **failed requests during the swap**: clients classify images over the agent's Unix socket
  the whole time; every non-200 answer counts (it must be 0);
- **canary decision time**: rounds alternate between a plain release and
  one signed with a canary table (``CANARY``); for those, publish → verdict (the device's
  ``canary_promoted`` event) and verdict → committed (its outcome event), both read from the
  device's events topic as they arrive, with the same clients running;
- **baseline**, measured in the same run on the same machine: a plain HTTP download + SHA-256
  of the same artifact from the same server — the part no updater can avoid — so the
  ratio says what the rest of the pipeline costs, independent of machine speed.

Real parts only: a real Mosquitto (the test suite's launcher), the real ``edgeagent run``
daemon as a separate process, the hub's artifact server and signing code.

    python scripts/bench_update.py [--model mobilenet_v3_small] [--rounds 3] [--clients 4] [--json]
    python scripts/bench_update.py --deltas [--rounds 3] [--json]   # delta updates (bench_deltas)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import aiomqtt

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from devtools.agent_process import spawn_agent  # noqa: E402
from devtools.background import WatchedTasks  # noqa: E402
from devtools.broker import Broker  # noqa: E402 - the Mosquitto launcher the tests use too
from devtools.package import set_fields  # noqa: E402
from devtools.waiting import until  # noqa: E402
from devtools.zoo import zoo_dir  # noqa: E402
from edgeagent.fleet.limits import MAX_ENVELOPE_BYTES  # noqa: E402
from edgeagent.fleet.manifest import parse_manifest  # noqa: E402
from edgeagent.fleet.release_canary import ReleaseCanary  # noqa: E402
from edgeagent.fleet.signing import decode_envelope  # noqa: E402
from edgeagent.fleet.topics import GroupTopics, Topics  # noqa: E402
from edgeagent.hub.keys import keygen  # noqa: E402
from edgeagent.hub.publish import publish  # noqa: E402
from edgeagent.hub.serve import start_artifact_server  # noqa: E402
from edgeagent.hub.sign import archive_package, device_needs, sign_package  # noqa: E402
from edgeagent.models.package import INSTALLED_VARIANTS, load_package  # noqa: E402

MODEL = "mobilenet_v3_small"  # the default: a zoo model with every runtime and precision
# Two builds of one model: a p99 ratio limit of 100 keeps a loaded machine's jitter from
# rolling it back, so the round times the decision, not a verdict that varies.
CANARY = "share=0.25,min_requests=200,max_p99_ratio=100"
BYTES_MODEL = "shapes_grid_mnv2"  # the zoo's detector: held-out data 21× its INT8 variant


def needed_bytes(package: Path, variants: list[str]) -> int:
    """What a device running ``variants`` needs of the package, in raw bytes."""
    return sum(path.stat().st_size for path in device_needs(load_package(package), variants))


def bytes_table(package: Path) -> dict[str, dict[str, float]]:
    """Per variant: bytes a device running it downloads (shared + its archive), what it
    needs, and the ratio — the release's split alone, nothing downloaded."""
    with tempfile.TemporaryDirectory(prefix="bench-update-archives-") as work:
        archives = archive_package(package, Path(work))
    table = {}
    for key, archive in archives.variants.items():
        downloaded, needed = archives.shared.size + archive.size, needed_bytes(package, [key])
        table[key] = {"bytes": downloaded, "needed": needed, "ratio": downloaded / needed}
    return table


def make_package(source: Path, out: Path, version: str) -> Path:
    """The whole zoo package (every runtime × precision) with its version set."""
    shutil.copytree(source, out)
    set_fields(out, {"version": version})
    return out


def downloads_of(envelope: bytes, installed: Path) -> tuple[list[str], int, int, list[str]]:
    """(URLs this device downloaded, their bytes, bytes of every artifact, its variants)."""
    manifest = parse_manifest(decode_envelope(envelope, max_bytes=MAX_ENVELOPE_BYTES).payload)
    chosen = (installed / INSTALLED_VARIANTS).read_text().split()
    artifacts = [manifest.artifact, *(v.artifact for v in manifest.variants if v.key in chosen)]
    everything = manifest.artifact.size + sum(v.artifact.size for v in manifest.variants)
    return [a.url for a in artifacts], sum(a.size for a in artifacts), everything, chosen


async def classify_forever(
    socket: Path, model: str, image: bytes, counts: dict, stop: asyncio.Event
) -> None:
    connector = aiohttp.UnixConnector(path=str(socket))
    async with aiohttp.ClientSession(connector=connector) as http:
        while not stop.is_set():
            try:
                async with http.post(f"http://agent/v1/models/{model}/classify", data=image) as r:
                    await r.read()
                    key = "ok" if r.status == 200 else f"http_{r.status}"
                    if r.status != 200 and key not in counts:
                        print(f"  first {key}: {(await r.text())[:300]}", file=sys.stderr)
            except aiohttp.ClientError as exc:
                key = type(exc).__name__
            counts[key] = counts.get(key, 0) + 1


async def serving_version(socket: Path, model: str) -> str:
    connector = aiohttp.UnixConnector(path=str(socket))
    async with (
        aiohttp.ClientSession(connector=connector) as http,
        http.get(f"http://agent/v2/models/{model}") as response,
    ):
        return (await response.json())["versions"][0]


async def served_variant(socket: Path, model: str, version: str) -> str:
    """The variant key (``runtime/precision``) the agent serves ``version`` of ``model`` on."""
    connector = aiohttp.UnixConnector(path=str(socket))
    async with (
        aiohttp.ClientSession(connector=connector) as http,
        http.get("http://agent/v1/status") as response,
    ):
        backend = (await response.json())["models"][model]["versions"][version]
    return f"{backend['runtime']}/{backend['precision']}"


async def wait_serving(socket: Path, model: str, version: str, timeout: float = 300) -> float:
    """When the agent first answered with ``version`` (perf_counter; polled every 10 ms)."""

    async def serving() -> bool:
        with contextlib.suppress(aiohttp.ClientError, KeyError, IndexError):
            return await serving_version(socket, model) == version
        return False

    await until(serving, timeout, poll_s=0.01, what=f"serving version {version}")
    return time.perf_counter()


async def record_events(port: int, arrived: dict[tuple[str, str], float]) -> None:
    """(deployment id, step) → when the device's event arrived (perf_counter), until cancelled."""
    async with aiomqtt.Client("127.0.0.1", port) as client:
        await client.subscribe(Topics("edgeagent", "bench", "bench").events, qos=1)
        async for message in client.messages:
            event = json.loads(bytes(message.payload))  # type: ignore[arg-type]
            arrived.setdefault((event.get("deployment_id", ""), event["step"]), time.perf_counter())


async def wait_event(arrived: dict, key: tuple[str, str], timeout: float = 600) -> float:
    """When the device's ``key`` event arrived (recorded by ``record_events``)."""
    await until(lambda: key in arrived, timeout, poll_s=0.01, what=f"a {key[1]} event for {key[0]}")
    return arrived[key]


async def baseline_fetch(urls: list[str]) -> float:
    """Download + SHA-256 of the artifacts, nothing else: the floor of any update."""
    started = time.perf_counter()
    async with aiohttp.ClientSession() as http:
        for url in urls:
            digest = hashlib.sha256()
            async with http.get(url) as response:
                async for chunk in response.content.iter_chunked(1 << 18):
                    digest.update(chunk)
            digest.hexdigest()
    return time.perf_counter() - started


async def run(args: argparse.Namespace) -> dict:
    zoo, model = zoo_dir(), args.model
    if not (zoo / model / "model.toml").is_file():
        raise SystemExit(f"no {model} in {zoo}: build the zoo first (scripts/setup.sh)")
    work = Path(tempfile.mkdtemp(prefix="edgeagent-bench-update-"))
    broker = Broker(work / "broker")
    broker.start()
    keys, artifacts, models = work / "keys", work / "artifacts", work / "models"
    for directory in (keys, artifacts, models):
        directory.mkdir()
    keygen(keys)
    runner, base_url = await start_artifact_server(artifacts)
    socket = work / "agent.sock"  # no model at start: 1.0.0 is the device's first release
    config = work / "agent.toml"
    config.write_text(
        f'[agent]\nstate_dir = "{work / "state"}"\nmodels_dir = "{models}"\n'
        f'device_id = "bench"\n[server]\nunix_socket = "{socket}"\ntcp_port = 0\n'
        f'[updates]\nenabled = true\ngroup = "bench"\ntrust_file = "{keys / "trust.json"}"\n'
        f"free_space_margin_bytes = 0\n[mqtt]\nport = {broker.port}\n"
    )
    agent = spawn_agent(
        ["--config", str(config)],
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=open(work / "agent.log", "wb"),  # noqa: SIM115 - closed with the process
    )
    rounds: list[dict] = []
    counts: dict[str, int] = {}
    try:
        assert agent.stdout is not None
        ready = await asyncio.to_thread(agent.stdout.readline)
        if not ready.startswith(b"edgeagent serving"):
            raise RuntimeError(f"agent did not start: {(work / 'agent.log').read_text()[-2000:]}")
        image = (zoo / "samples" / "flower.png").read_bytes()
        async with WatchedTasks() as tasks:
            arrived: dict[tuple[str, str], float] = {}
            tasks.spawn(record_events(broker.port, arrived), name="event listener")
            stop = asyncio.Event()
            load: list[asyncio.Task] = []
            for number in range(1, args.rounds + 2):
                version = f"{number}.0.0"
                package = make_package(zoo / model, work / "packages" / version, version)
                canary = number % 2 == 1 and number > 1  # alternate: plain, canary, plain, …
                artifact, release = sign_package(
                    package,
                    key_paths=[keys / "release.key"],
                    base_url=base_url,
                    out_dir=artifacts,
                    deployment_id=f"bench-{version}",
                    canary=ReleaseCanary.from_option(CANARY) if canary else None,
                )
                envelope = release.read_bytes()
                started = time.perf_counter()
                await publish(
                    broker.settings(), [GroupTopics("edgeagent", "bench").release(model)], envelope
                )
                served = await wait_serving(socket, model, version)
                urls, downloaded, everything, chosen = downloads_of(
                    envelope, work / "state" / "store" / model / version
                )
                needed = needed_bytes(package, chosen)
                serves = await served_variant(socket, model, version)
                baseline = await baseline_fetch(urls)
                decision: dict[str, float] = {}
                if canary:
                    verdict = await wait_event(arrived, (f"bench-{version}", "canary_promoted"))
                    committed = await wait_event(arrived, (f"bench-{version}", "done"))
                    decision = {
                        "publish_to_verdict_s": verdict - started,
                        "verdict_to_committed_s": committed - verdict,
                    }
                rounds.append(
                    {
                        "version": version,
                        "canary": canary,
                        **decision,
                        "artifact_bytes": artifact.stat().st_size,
                        "bytes_per_device": downloaded,
                        "bytes_all_variants": everything,
                        "bytes_needed": needed,
                        "bytes_ratio_to_needed": downloaded / needed,
                        # what it downloaded ÷ what the variant it serves needs: above 1
                        # when it fetched variants it does not serve (say, CUDA or NPU variants
                        # for a device whose runtimes do not list them)
                        "bytes_ratio_to_served": downloaded / needed_bytes(package, [serves]),
                        "variants": chosen,
                        "serves": serves,
                        "publish_to_serving_s": served - started,
                        "baseline_fetch_s": baseline,
                    }
                )
                print(
                    f"  {version}: publish → serving {served - started:.3f} s "
                    f"(baseline download+hash {baseline:.3f} s)",
                    file=sys.stderr,
                )
                if number == 1:  # clients only once the first release serves: none fails
                    load = [
                        tasks.spawn(
                            classify_forever(socket, model, image, counts, stop),
                            name=f"client {i}",
                        )
                        for i in range(args.clients)
                    ]
                    await asyncio.sleep(1.0)
            await asyncio.sleep(0.5)
            stop.set()
            await asyncio.gather(*load)  # the listener is cancelled on leaving the block
    finally:
        agent.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            agent.wait(30)
        if agent.poll() is None:
            agent.kill()
        await runner.cleanup()
        broker.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    first, rounds = rounds[0], rounds[1:]  # the first release: nothing served, no clients
    plain = [r for r in rounds if not r["canary"]]
    canaries = [r for r in rounds if r["canary"]]
    median = statistics.median(r["publish_to_serving_s"] for r in plain)
    base = statistics.median(r["baseline_fetch_s"] for r in plain)

    def median_of(key: str) -> float | None:
        return statistics.median(r[key] for r in canaries) if canaries else None

    failed = sum(v for k, v in counts.items() if k != "ok")
    # a zoo without the detector (the smoke test's): the benched model's own split
    split = args.bytes_model if (zoo / args.bytes_model / "model.toml").is_file() else model
    return {
        "model": model,
        "artifact_bytes": rounds[0]["artifact_bytes"],
        "bytes_per_device": rounds[0]["bytes_per_device"],
        "bytes_all_variants": rounds[0]["bytes_all_variants"],
        "bytes_needed": rounds[0]["bytes_needed"],
        "bytes_ratio_to_needed": rounds[0]["bytes_ratio_to_needed"],
        "variants": rounds[0]["variants"],
        "serves": rounds[0]["serves"],
        "bytes_ratio_to_served": rounds[0]["bytes_ratio_to_served"],
        "first_release": first,
        "bytes_model": split,
        "bytes_by_variant": bytes_table(zoo / split),
        "rounds": rounds,
        "clients": args.clients,
        "median_publish_to_serving_s": median,
        "median_baseline_fetch_s": base,
        "ratio_to_baseline": median / base if base else None,
        "canary": CANARY,
        "median_canary_publish_to_verdict_s": median_of("publish_to_verdict_s"),
        "median_canary_verdict_to_committed_s": median_of("verdict_to_committed_s"),
        "requests": counts,
        "failed_requests": failed,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=MODEL, help="the zoo model to update ($EDGEAGENT_ZOO)")
    parser.add_argument(
        "--rounds", type=int, default=4, help="updates to time, plain and canary alternately"
    )
    parser.add_argument("--clients", type=int, default=4, help="concurrent classify clients")
    parser.add_argument(
        "--bytes-model", default=BYTES_MODEL, help="the zoo package whose split is measured"
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    parser.add_argument(
        "--deltas",
        action="store_true",
        help="measure delta updates instead (scripts/bench_deltas.py: zstd, bsdiff4, detools on "
        "a head retrain of MobileNetV2 and an agent patch release)",
    )
    parser.add_argument(
        "--quick", action="store_true", help="with --deltas: the new-head case, zstd only"
    )
    args = parser.parse_args()
    if args.deltas:
        from bench_deltas import main as deltas

        deltas(min(args.rounds, 3), args.json, args.quick)
        return 0
    result = asyncio.run(run(args))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"{result['model']} shared artifact {result['artifact_bytes'] / 1e6:.1f} MB, "
            f"{args.rounds} updates, {args.clients} concurrent clients\n"
            f"  bytes per device    {result['bytes_per_device'] / 1e6:.1f} MB "
            f"({', '.join(result['variants'])}; every variant: "
            f"{result['bytes_all_variants'] / 1e6:.1f} MB; "
            f"{result['bytes_ratio_to_needed']:.2f}× what it needs; "
            f"{result['bytes_ratio_to_served']:.2f}× what {result['serves']} needs)\n"
            f"  first release       {result['first_release']['bytes_per_device'] / 1e6:.1f} MB "
            f"({', '.join(result['first_release']['variants'])}; "
            f"{result['first_release']['bytes_ratio_to_served']:.2f}× what "
            f"{result['first_release']['serves']}, which it serves, needs)\n"
            f"  bytes per device of {result['bytes_model']}, by variant (÷ what it needs): "
            + ", ".join(
                f"{key} {row['bytes'] / 1e6:.2f} MB ({row['ratio']:.2f}×)"
                for key, row in result["bytes_by_variant"].items()
            )
            + "\n"
            f"  publish → serving   median {result['median_publish_to_serving_s']:.3f} s\n"
            f"  baseline (download+hash)  {result['median_baseline_fetch_s']:.3f} s\n"
            f"  ratio                     {result['ratio_to_baseline']:.1f}×\n"
            f"  canary ({CANARY}): publish → verdict median "
            f"{result['median_canary_publish_to_verdict_s'] or 0:.3f} s, verdict → committed "
            f"{result['median_canary_verdict_to_committed_s'] or 0:.3f} s\n"
            f"  requests during updates   {result['requests']}\n"
            f"  failed requests           {result['failed_requests']}"
        )
    return 1 if result["failed_requests"] else 0


if __name__ == "__main__":
    sys.exit(main())
