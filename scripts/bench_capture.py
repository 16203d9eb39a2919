#!/usr/bin/env python3
"""What capture costs a serving agent, whether its caps hold, and whether uploads keep to the cap.

1. Two daemons from this tree serve ``digits_mnv3``, identical but for ``[capture]`` (B keeps
   every answer that the caps allow: ``sample_percent = 100``); ``--concurrency`` clients post
   ``/classify`` to one, then the other, in alternating rounds of ``--seconds``. Reported: each
   side's median p95 latency and the median of the paired B/A p95 ratios (goal ≤ 1.02),
   their range over the rounds, and the daemon's CPU time per request on each side (user +
   system, from the kernel: far steadier than a latency percentile on a shared machine).
2. B's audit log: the most samples any 60 s / 3600 s window holds, against the caps.
3. B's state directory searched for JPEG/PNG bytes in the clear (goal: none).
4. The uploader sends ``--upload-samples`` samples to an in-process hub under
   ``--bandwidth`` bytes/s: the achieved rate ÷ the cap (goal within ±10 %).

    python scripts/bench_capture.py [--concurrency 16] [--seconds 20] [--rounds 4]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from devtools.bench_daemon import start_daemon, stop_tree, wait_ready  # noqa: E402
from devtools.figures import add_report_arguments, report  # noqa: E402
from devtools.http_endpoint import http_client  # noqa: E402
from devtools.plaintext import plaintext_images  # noqa: E402
from devtools.sample_hub import sample_hub, write_device_tokens  # noqa: E402
from edgeagent.capture.audit import AuditLog  # noqa: E402
from edgeagent.capture.settings import CaptureSettings  # noqa: E402
from edgeagent.capture.spool import Spool, new_sample_id  # noqa: E402
from edgeagent.capture.uploader import Uploader  # noqa: E402
from edgeagent.hub.server.samples_settings import SamplesSettings  # noqa: E402

IMAGE = (ROOT / "zoo" / "samples" / "digit_7.png").read_bytes()
PER_MINUTE, PER_HOUR = 30, 300


async def drive(sock: Path, concurrency: int, seconds: float) -> list[float]:
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds
    async with http_client(sock, limit=concurrency) as http:

        async def client() -> None:
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                async with http.post("/v1/models/digits_mnv3/classify", data=IMAGE) as answer:
                    await answer.read()
                    answer.raise_for_status()
                latencies.append((time.perf_counter() - started) * 1000)

        await asyncio.gather(*(client() for _ in range(concurrency)))
    return latencies


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of the daemon and its children so far."""
    process = psutil.Process(pid)
    return sum(sum(p.cpu_times()[:2]) for p in (process, *process.children(recursive=True)))


def ratios(sides: dict[str, list[float]]) -> list[float]:
    """Each round's capture-on figure over the capture-off one run just before it."""
    return [on / off for off, on in zip(sides["off"], sides["on"], strict=True)]


def paired_ratio(sides: dict[str, list[float]]) -> float:
    return round(statistics.median(ratios(sides)), 3)


def most_in_window(times: list[float], seconds: float) -> int:
    times = sorted(times)
    return max(
        (int(np.searchsorted(times, t + seconds, "left")) - i for i, t in enumerate(times)),
        default=0,
    )


async def paired_rounds(sides: dict, args: argparse.Namespace) -> dict:
    """Alternating rounds on the two daemons: p95 latency and CPU time per request of each."""
    await drive(sides["off"].sock, args.concurrency, 2)  # warm both
    await drive(sides["on"].sock, args.concurrency, 2)
    p95: dict[str, list[float]] = {"off": [], "on": []}
    cpu_ms: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(args.rounds):
        for name in ("off", "on"):
            before = cpu_seconds(sides[name].process.pid)
            found = await drive(sides[name].sock, args.concurrency, args.seconds)
            spent = cpu_seconds(sides[name].process.pid) - before
            p95[name].append(float(np.percentile(found, 95)))
            cpu_ms[name].append(spent * 1000 / len(found))
    return {
        "concurrency": args.concurrency,
        "p95_ms_off": round(statistics.median(p95["off"]), 2),
        "p95_ms_on": round(statistics.median(p95["on"]), 2),
        "p95_ratio_on_off": paired_ratio(p95),
        "p95_ratio_range": [round(min(ratios(p95)), 3), round(max(ratios(p95)), 3)],
        "cpu_ms_per_request_off": round(statistics.median(cpu_ms["off"]), 4),
        "cpu_ms_per_request_on": round(statistics.median(cpu_ms["on"]), 4),
        "cpu_ratio_on_off": paired_ratio(cpu_ms),
    }


def kept(state: Path, status: dict) -> dict:
    """What the capturing daemon kept, against its caps, and what lies in the clear."""
    folder = next(state.rglob("capture"), None)  # made by the first sample kept
    entries = AuditLog(folder).entries() if folder is not None else []
    audit = [e for e in entries if e["event"] == "captured"]
    times = [e["captured_at"] for e in audit]  # when the rules kept each (not when written)
    return {
        "captured": len(times),
        "outcomes": status["outcomes"],
        "most_in_60s": most_in_window(times, 60),
        "per_minute_cap": PER_MINUTE,
        "most_in_3600s": most_in_window(times, 3600),
        "per_hour_cap": PER_HOUR,
        "plaintext_image_files": len(plaintext_images(state)),
    }


async def serving(args: argparse.Namespace, work: Path) -> dict:
    package = ROOT / "zoo" / "digits_mnv3"
    capture = (
        f"[capture]\nenabled = true\nsample_percent = {args.sample_percent}\n"
        f"per_minute = {PER_MINUTE}\n"
        f"per_hour = {PER_HOUR}\nper_day = 0\n"
    )
    sides = {}
    for name, tables in (("off", ""), ("on", "" if args.control else capture)):
        (work / name).mkdir()
        # A fixed plan on both: a plan searched under load could differ between the two.
        sides[name] = start_daemon(package, work / name, 0, server='plan = "fixed"', tables=tables)
    try:
        for daemon in sides.values():
            await wait_ready(daemon.sock, daemon.process)
        figures = await paired_rounds(sides, args)
        async with http_client(sides["on"].sock) as http, http.get("/v1/status") as answer:
            status = (await answer.json()).get("capture")
    finally:
        for daemon in sides.values():
            stop_tree(daemon.process)
    if not args.control:
        figures.update(kept(work / "on" / "state", status))
    return figures


async def upload_rate(args: argparse.Namespace, work: Path) -> dict:
    token = "bench-device-token-0123456789"
    tokens = write_device_tokens(work / "device-tokens", {"bench": ("lab", token)})
    (work / "token").write_text(token)
    (work / "token").chmod(0o600)
    key = os.urandom(32)
    spool = Spool(work / "spool", lambda: key, 1 << 30)
    rng = np.random.default_rng(0)
    from io import BytesIO

    from PIL import Image

    size = 0
    for index in range(args.upload_samples):
        out = BytesIO()
        Image.fromarray(rng.integers(0, 255, (160, 160, 3), np.uint8)).save(out, "JPEG", quality=90)
        record = {
            "id": "",
            "device_id": "bench",
            "model": "digits_mnv3",
            "version": "1.0.0",
            "variant": "onnxruntime/fp32@cpu",
            "task": "classification",
            "captured_at": 1.7e9 + index,
            "width": 160,
            "height": 160,
            "outputs": {"labels": ["7"], "scores": [0.5]},
        }
        sample_id = new_sample_id(1.7e9 + index)
        spool.write(sample_id, dict(record, id=sample_id), out.getvalue())
        size += len(out.getvalue())
    async with sample_hub(
        work / "hub", SamplesSettings(device_tokens=tokens, groups=("lab",)), "x" * 20
    ) as hub:
        settings = CaptureSettings(
            upload=True,
            hub_url=hub.url,
            token_file=work / "token",
            bandwidth_bytes_per_s=args.bandwidth,
        )
        uploader = Uploader(settings, spool, AuditLog(work))
        started = time.perf_counter()
        sent = await uploader.run_once()
        seconds = time.perf_counter() - started
    rate = uploader.sent_bytes / seconds
    return {
        "uploaded": sent,
        "image_bytes": size,
        "bandwidth_cap_bytes_per_s": args.bandwidth,
        "achieved_bytes_per_s": round(rate),
        "rate_over_cap": round(rate / args.bandwidth, 3),
    }


async def main_async(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-capture-") as tmp:
        work = Path(tmp)
        (work / "serve").mkdir()
        (work / "upload").mkdir()
        figures = await serving(args, work / "serve")
        if not args.control:
            figures.update(await upload_rate(args, work / "upload"))
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=20.0, help="per round and side")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument(
        "--control",
        action="store_true",
        help="capture off on both sides (A/A): the ratios the bench itself makes",
    )
    parser.add_argument(
        "--sample-percent",
        type=float,
        default=100.0,
        help="B's [capture] sample_percent (0: the hook runs, nothing is kept)",
    )
    parser.add_argument("--upload-samples", type=int, default=60)
    parser.add_argument("--bandwidth", type=int, default=256 * 1024, help="upload cap, bytes/s")
    add_report_arguments(parser)
    args = parser.parse_args()
    figures = asyncio.run(main_async(args))
    return report(figures, args)


if __name__ == "__main__":
    sys.exit(main())
