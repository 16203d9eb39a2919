#!/usr/bin/env python3
"""Soak the agent: N minutes at concurrency 16 on its Unix socket with a mix of good and bad
requests, then report errors, the daemon's RSS at start and end, and its file descriptors.

    scripts/bench_soak.py                  # 10 minutes
    scripts/bench_soak.py --minutes 1 --json

The daemon is a real ``edgeagent run`` process serving the tiny test model (the HTTP path is
what is soaked, not a runtime). Every request has the status it must get (200 for the good
ones, 400/404/413 for the bad ones); an *error* is any other status or a failed connection.
RSS is measured after one warm-up round of every kind of request, so start-up allocation is
not counted as growth; the descriptors at the end are counted as the load stops, with the
client's keep-alive connections still open.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import aiohttp
import numpy as np
import psutil
from PIL import Image

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from devtools.agent_process import running_daemon  # noqa: E402
from edgeagent.api.v2 import HEADER_LENGTH, encode_request  # noqa: E402

MAX_BODY = 1024 * 1024
INFER = "/v2/models/tiny/infer"


def _png() -> bytes:
    out = io.BytesIO()
    pixels = np.random.default_rng(0).integers(0, 255, (32, 32, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def _jpeg() -> bytes:
    out = io.BytesIO()
    pixels = np.random.default_rng(1).integers(0, 255, (64, 64, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(out, "JPEG")
    return out.getvalue()


def _json_infer(shape: list[int], data: list | None = None) -> bytes:
    values = data if data is not None else [0.25] * int(np.prod(shape))
    tensor = {"name": "input", "shape": shape, "datatype": "FP32", "data": values}
    return json.dumps({"inputs": [tensor]}).encode()


def request_mix() -> list[tuple[str, str, str, bytes, dict[str, str], int]]:
    """(kind, method, path, body, headers, expected status)."""
    x = np.random.default_rng(2).standard_normal((1, 3, 8, 8)).astype(np.float32)
    binary, length = encode_request({"input": x}, binary=True)
    octet = {"Content-Type": "application/octet-stream"}
    as_json = {"Content-Type": "application/json"}
    classify, png, jpeg = "/v1/models/tiny/classify", {"Content-Type": "image/png"}, _jpeg()
    deep = b'{"inputs":' + b"[" * 3000 + b"]" * 3000 + b"}"
    ghost = "/v2/models/ghost/infer"
    return [
        ("infer binary", "POST", INFER, binary, {**octet, HEADER_LENGTH: str(length)}, 200),
        ("infer json", "POST", INFER, _json_infer([1, 3, 8, 8]), as_json, 200),
        ("classify png", "POST", classify, _png(), png, 200),
        ("metadata", "GET", "/v2/models/tiny", b"", {}, 200),
        ("live", "GET", "/v2/health/live", b"", {}, 200),
        ("status", "GET", "/v1/status", b"", {}, 200),
        ("bad json", "POST", INFER, b'{"inputs": [', as_json, 400),
        ("bad shape", "POST", INFER, _json_infer([1, 3, 4, 4]), as_json, 400),
        ("huge shape", "POST", INFER, _json_infer([0, 2**62, 2**62], []), as_json, 400),
        ("deep nesting", "POST", INFER, deep, as_json, 400),
        ("cut jpeg", "POST", classify, jpeg[:500], {"Content-Type": "image/jpeg"}, 400),
        ("unknown model", "POST", ghost, _json_infer([1, 3, 8, 8]), as_json, 404),
        ("too large", "POST", INFER, b" " * (MAX_BODY + 1), as_json, 413),
    ]


async def soak(socket_path: Path, seconds: float, concurrency: int, on_warm) -> dict:
    mix = request_mix()
    sent: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    connector = aiohttp.UnixConnector(path=str(socket_path), limit=concurrency)
    async with aiohttp.ClientSession("http://agent", connector=connector) as http:

        async def one(kind, method, path, body, headers, expected) -> None:
            sent[kind] += 1
            try:
                async with http.request(method, path, data=body or None, headers=headers) as r:
                    await r.read()
                    if r.status != expected:
                        errors[f"{kind}: {r.status}"] += 1
            except (aiohttp.ClientError, OSError) as exc:
                errors[f"{kind}: {type(exc).__name__}"] += 1

        for entry in mix:  # warm-up round, not counted
            await one(*entry)
        sent.clear()
        start = on_warm()
        deadline = time.monotonic() + seconds

        async def worker(offset: int) -> None:
            index = offset
            while time.monotonic() < deadline:
                await one(*mix[index % len(mix)])
                index += 1

        await asyncio.gather(*(worker(i) for i in range(concurrency)))
    return {"start": start, "requests": dict(sent), "errors": dict(errors)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="edgeagent-soak-") as root,
        running_daemon(Path(root), f"max_body_bytes = {MAX_BODY}\n") as daemon,
    ):
        process = psutil.Process(daemon.process.pid)

        def measure() -> dict:
            return {"rss_mb": process.memory_info().rss / 2**20, "fds": process.num_fds()}

        started = time.monotonic()
        result = asyncio.run(soak(daemon.socket, args.minutes * 60, args.concurrency, measure))
        elapsed = time.monotonic() - started
        end = measure()
        alive = daemon.alive()
    start = result["start"]
    total = sum(result["requests"].values())
    figures = {
        "minutes": args.minutes,
        "concurrency": args.concurrency,
        "requests": total,
        "requests_per_s": round(total / elapsed, 1),
        "errors": sum(result["errors"].values()),
        "error_kinds": result["errors"],
        "rss_start_mb": round(start["rss_mb"], 1),
        "rss_end_mb": round(end["rss_mb"], 1),
        "rss_growth_mb": round(end["rss_mb"] - start["rss_mb"], 1),
        "fds_start": start["fds"],
        "fds_end": end["fds"],
        "daemon_alive": alive,
        "by_kind": result["requests"],
    }
    if args.json:
        print(json.dumps(figures, indent=2))
    else:
        for key, value in figures.items():
            print(f"{key:>16}: {value}")
    return 0 if alive and not figures["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
