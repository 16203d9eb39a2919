#!/usr/bin/env python3
"""Two settings of the daemon side by side: which is faster, with the machine's drift cancelled.

These machines drift 1.6× from minute to minute, so two separate ``bench_serving.py`` runs
cannot tell a 10 % change from noise. This starts two daemons from this tree, identical but
for extra ``[server]`` lines (``--a``, ``--b``), and drives them in alternating rounds on the
same body; every round of B is paired with the A round just before it. Reports the medians of
each and the median of the paired B/A ratios (req/s, and daemon CPU per request including its
child processes, the JSON helper).

    python scripts/bench_ab.py --a "json_helper_max_bytes = 0" --b ""   # JSON thread vs helper
    python scripts/bench_ab.py --mode "v2 binary" --concurrency 4 --a "" --b "event_loop = 'uvloop'"
    python scripts/bench_ab.py --mode "v2 binary" --tcp --b-tls --a "" --b ""  # TLS's cost

``--tcp`` drives both over loopback TCP with the token instead of the Unix socket; ``--b-tls``
gives B a ``[tls]`` certificate (made here with ``cryptography``), so B is HTTPS.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import statistics
import sys
import tempfile
from pathlib import Path

import bench_serving
import numpy as np
import psutil

from devtools.bench_daemon import Daemon, start_daemon, wait_ready
from devtools.http_endpoint import Endpoint, TlsPort
from devtools.package import pinned_package
from devtools.pki import Pki, make_pki
from edgeagent.models.package import load_package


async def run(args: argparse.Namespace) -> dict:
    package = load_package(args.model)
    spec = package.inputs[0]
    shape = [1 if d == -1 else d for d in spec.shape]
    frame = np.random.default_rng(1).standard_normal(shape).astype(spec.dtype)
    url, body, headers = bench_serving.requests_for(package, frame)[args.mode]
    with tempfile.TemporaryDirectory(prefix="bench-ab-") as tmp:
        pki = make_pki(Path(tmp) / "pki") if args.b_tls else None
        daemons = {}
        for name, lines in (("A", args.a), ("B", args.b)):
            work = Path(tmp) / name
            pinned = pinned_package(args.model, args.precision, work / "pinned" / package.name)
            tls = pki if name == "B" else None
            tables = (
                f"[tls]\ncert_file = '{tls.server_cert}'\nkey_file = '{tls.server_key}'\n"
                if tls
                else ""
            )
            daemons[name] = start_daemon(
                pinned, work, args.threads, peers=args.tcp, server=lines, tables=tables
            )
        try:
            measures = {}
            for name, daemon in daemons.items():
                await wait_ready(daemon.sock, daemon.process)
                endpoint, sent = where(daemon, headers, args.tcp, pki if name == "B" else None)
                measures[name] = bench_serving.served_measure(
                    endpoint, url, body, sent, args.concurrency
                )
                await measures[name](1.0)  # warm-up: threads started, helpers spawned
            rates: dict[str, list[float]] = {"A": [], "B": []}
            cpus: dict[str, list[float]] = {"A": [], "B": []}
            for _ in range(args.rounds):
                for name, daemon in daemons.items():
                    process = psutil.Process(daemon.process.pid)
                    before = bench_serving.cpu_seconds(process)
                    latencies, elapsed, errors, _ = await measures[name](args.seconds)
                    if errors:
                        raise SystemExit(f"{name}: {errors} failed requests")
                    rates[name].append(len(latencies) / elapsed)
                    cpus[name].append(
                        1e3 * (bench_serving.cpu_seconds(process) - before) / len(latencies)
                    )
        finally:
            for daemon in daemons.values():
                daemon.process.terminate()
                daemon.process.wait()
    pairs = [b / a for a, b in zip(rates["A"], rates["B"], strict=True)]
    cpu_pairs = [b / a for a, b in zip(cpus["A"], cpus["B"], strict=True)]
    return {
        "mode": args.mode,
        "transport": ("https" if args.b_tls else "tcp") if args.tcp else "unix",
        "concurrency": args.concurrency,
        "rounds": args.rounds,
        "seconds": args.seconds,
        "daemons": {
            name: {
                "server": lines,
                "requests_per_s": statistics.median(rates[name]),
                "cpu_ms_per_request": statistics.median(cpus[name]),
                "rounds_requests_per_s": rates[name],
            }
            for name, lines in (("A", args.a), ("B", args.b))
        },
        "b_over_a_requests_per_s": statistics.median(pairs),
        "paired_b_over_a": pairs,
        "b_over_a_cpu_per_request": statistics.median(cpu_pairs),
    }


def where(
    daemon: Daemon, headers: dict[str, str], tcp: bool, tls: Pki | None
) -> tuple[Endpoint, dict[str, str]]:
    """Where to send the requests (the Unix socket; the TCP port, HTTPS with ``tls``'s CA)
    and their headers (over TCP, with the daemon's token)."""
    if not tcp:
        return daemon.sock, headers
    sent = {**headers, "Authorization": f"Bearer {daemon.token}"}
    if tls is None:
        return daemon.tcp_port, sent
    return TlsPort(daemon.tcp_port, ssl.create_default_context(cafile=str(tls.ca))), sent


def report(result: dict) -> str:
    lines = [
        f"{result['mode']} over {result['transport']}, c={result['concurrency']}, "
        f"{result['rounds']} alternating rounds of {result['seconds']} s"
    ]
    for name, daemon in result["daemons"].items():
        lines.append(
            f"  {name} [{daemon['server'] or 'defaults'}]: {daemon['requests_per_s']:.1f} req/s, "
            f"{daemon['cpu_ms_per_request']:.2f} ms CPU/req "
            f"(rounds: {', '.join(f'{r:.1f}' for r in daemon['rounds_requests_per_s'])})"
        )
    lines.append(
        f"  B/A: req/s {result['b_over_a_requests_per_s']:.3f} (paired rounds: "
        f"{', '.join(f'{p:.2f}' for p in result['paired_b_over_a'])}), "
        f"CPU/req {result['b_over_a_cpu_per_request']:.3f}"
    )
    return "\n".join(lines)


def main() -> int:
    description = __doc__.split("\n\n")[0]
    parser = bench_serving.one_path_options(description, seconds=5.0, rounds=8)
    parser.add_argument("--a", required=True, help="extra [server] lines of daemon A")
    parser.add_argument("--b", required=True, help="extra [server] lines of daemon B")
    parser.add_argument("--tcp", action="store_true", help="drive both over loopback TCP")
    parser.add_argument(
        "--b-tls", action="store_true", help="B serves HTTPS ([tls], a test CA); implies --tcp"
    )
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args()
    args.tcp = args.tcp or args.b_tls
    result = asyncio.run(run(args))
    print(json.dumps(result, indent=2) if args.json else report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
