#!/usr/bin/env python3
"""The daemon's peak memory under a burst of large images, with and without the pixel budget.

A flat PNG of 39.6 Mpx is a ~128 kB upload that takes ~150 MB while decoded and resized, so a
handful at once can take a small board's memory. This starts ``edgeagent run`` daemons from
this tree, identical but for ``[server] max_decoding_pixels``: A with room for one image at a
time (what the default 40 Mpx gives 39.6 Mpx images), B with room for the whole burst (the
agent before the budget). Each round
sends ``--concurrency`` such PNGs at once to /classify over the Unix socket and reads the
daemon's peak RSS (``VmHWM``, reset after a warm-up request through ``clear_refs``); rounds of
A and B alternate, and the report gives the medians of each, their ratio, the answers' status
codes and the burst's seconds. Linux only (``/proc``).

    python scripts/bench_images.py                        # 8 PNGs of 39.6 Mpx, 3 rounds each
    python scripts/bench_images.py --pixels 4000000 --concurrency 2 --rounds 1 --json
"""

from __future__ import annotations

import argparse
import http.client
import io
import json
import socket
import statistics
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from devtools.agent_process import running_daemon  # noqa: E402

CLASSIFY = "/v1/models/tiny/classify"


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: Path) -> None:
        super().__init__("localhost", timeout=300)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(str(self.path))


def _classify(sock: Path, image: bytes) -> int:
    connection = _UnixConnection(sock)
    try:
        connection.request("POST", CLASSIFY, image, {"Content-Type": "image/png"})
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def _flat_png(pixels: int) -> bytes:
    width = int(pixels**0.5 * 1.5**0.5)  # a 3:2 photo's shape
    height = pixels // width
    out = io.BytesIO()
    Image.new("RGB", (width, height), (30, 90, 150)).save(out, "PNG")
    return out.getvalue()


def _status_kb(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1])
    raise KeyError(key)


def one_round(budget: int, pixels: int, image: bytes, concurrency: int) -> dict:
    """A fresh daemon with ``max_decoding_pixels = budget``; the burst's peak RSS growth."""
    with tempfile.TemporaryDirectory(prefix="bench-images-") as tmp:
        server = (
            f"max_image_pixels = {pixels}\nmax_decoding_pixels = {budget}\n"
            "request_timeout_s = 300\n"  # a slow machine still answers every image
        )
        with running_daemon(Path(tmp), server) as daemon:
            pid = daemon.process.pid
            _classify(daemon.socket, _flat_png(640 * 480))  # warm: Pillow loaded, model run
            Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM := VmRSS
            before = _status_kb(pid, "VmRSS")
            started = time.perf_counter()
            with ThreadPoolExecutor(concurrency) as pool:
                sent = [pool.submit(_classify, daemon.socket, image) for _ in range(concurrency)]
                codes = [future.result() for future in sent]
            seconds = time.perf_counter() - started
            peak = _status_kb(pid, "VmHWM")
    return {"peak_growth_mb": (peak - before) / 1024, "seconds": seconds, "codes": codes}


def run(args: argparse.Namespace) -> dict:
    image = _flat_png(args.pixels)
    budgets = {"A": args.pixels, "B": args.pixels * args.concurrency}
    rounds: dict[str, list[dict]] = {"A": [], "B": []}
    for _ in range(args.rounds):
        for name in ("A", "B"):
            rounds[name].append(one_round(budgets[name], args.pixels, image, args.concurrency))
    report: dict = {
        "pixels": args.pixels,
        "png_bytes": len(image),
        "concurrency": args.concurrency,
        "rounds": args.rounds,
    }
    for name, runs in rounds.items():
        report[name] = {
            "max_decoding_pixels": budgets[name],
            "peak_growth_mb": statistics.median(r["peak_growth_mb"] for r in runs),
            "seconds": statistics.median(r["seconds"] for r in runs),
            "codes": dict(Counter(str(code) for r in runs for code in r["codes"])),
        }
    report["b_over_a_peak_growth"] = report["B"]["peak_growth_mb"] / report["A"]["peak_growth_mb"]
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pixels", type=int, default=39_600_000, help="pixels of each PNG")
    parser.add_argument("--concurrency", type=int, default=8, help="PNGs sent at once")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each daemon")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    report = run(args)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(
        f"{args.concurrency} flat PNGs of {args.pixels / 1e6:.1f} Mpx "
        f"({report['png_bytes']} bytes) at once, median of {args.rounds} rounds each:"
    )
    for name in ("A", "B"):
        row = report[name]
        print(
            f"  {name}: max_decoding_pixels = {row['max_decoding_pixels']}: peak RSS "
            f"+{row['peak_growth_mb']:.0f} MB, {row['seconds']:.1f} s, answers {row['codes']}"
        )
    print(f"  B/A peak growth: {report['b_over_a_peak_growth']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
