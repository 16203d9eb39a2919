#!/usr/bin/env python3
"""Fleet benchmark skeleton for the hub server (issue 16, item 5): N simulated devices, one
Mosquitto, the real ``edgeagent hub server`` process.

What it measures now:

- **connect**: N devices connect, say online and publish their retained state report;
- **ingest**: a freshly started hub server reads every retained report (the sync marker says
  when) — reports/s, and how many devices it counted (must be N);
- **fleet query**: ``GET /api/v1/devices`` (first page, and filtered by model+version), median
  of 20;
- **staged rollout** 1 % → 10 % → 100 % with an abort threshold, until every device answered;
  with ``--fail-pct P`` a random (seeded) P % of devices fail, so with P above the abort
  threshold stage 1 should abort before stage 2.

The devices are **stubs** (``tests/integration/hub_fleet.FakeDevice``): real MQTT sessions
with the agent's own ``UpdateReporter`` building every state report and outcome event, but no
download, install or inference — an answer is immediate. All devices run in this one process.
Not yet here (see the issue): several device processes, the real update client with artifacts
from ``hub serve``, hub CPU, fan-out timing, and the two-broker bridge.

    python scripts/bench_fleet.py --devices 1000 [--db postgresql://…] [--fail-pct 30] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the simulator is the test suite's device double

from devtools.broker import Broker  # noqa: E402
from devtools.hub_fleet import (  # noqa: E402
    Api,
    FakeDevice,
    HubProcess,
    make_release,
)


async def _timed(api: Api, path: str, rounds: int = 20) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        await api.call("GET", path)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


async def bench(args: argparse.Namespace, workdir: Path) -> dict:
    broker = Broker(workdir / "broker")
    broker.start()
    # thousands of sessions in one process answer pings late: a test-sized keep-alive (5 s)
    # would have the broker drop them
    settings = broker.settings(keepalive_s=120, connect_timeout_s=60.0)
    devices: list[FakeDevice] = []
    hub = None
    try:
        chance = random.Random(16)  # the same devices fail in every run
        start = time.perf_counter()
        for i in range(args.devices):
            fails = chance.random() * 100 < args.fail_pct
            device = FakeDevice(
                settings, f"sim-{i:05d}", "bench", answer="failed" if fails else "succeeded"
            )
            devices.append(device)
        for chunk in range(0, len(devices), 100):  # bounded concurrency for the connects
            await asyncio.gather(*(d.start() for d in devices[chunk : chunk + 100]))
        connect_s = time.perf_counter() - start

        db = args.db or f"sqlite:///{workdir / 'hub.db'}"
        hub = HubProcess(db, settings, "--max-page-size", "1000")
        start = time.perf_counter()
        api = Api(await hub.start())
        health = await api.synced()
        ingest_s = time.perf_counter() - start
        page_ms = await _timed(api, "/api/v1/devices?limit=100")
        filtered_ms = await _timed(
            api, "/api/v1/devices?model=mobilenet_v2&version=1.0.0&limit=100"
        )

        await api.call("POST", "/api/v1/releases", expect=201, data=make_release("2.0.0"))
        start = time.perf_counter()
        created = await api.call(
            "POST",
            "/api/v1/deployments",
            expect=201,
            json={
                "model": "mobilenet_v2",
                "version": "2.0.0",
                "group": "bench",
                "stages_pct": [1, 10, 100],
                "abort_threshold_pct": args.abort_threshold,
                "stage_timeout_s": 300,
            },
        )
        done = await api.until(created["id"], "succeeded", "aborted")
        rollout_s = time.perf_counter() - start
        return {
            "devices": args.devices,
            "database": health["database"],
            "note": "devices are stubs: real MQTT + UpdateReporter, no download/inference",
            "connect_s": round(connect_s, 2),
            "hub_start_to_synced_s": round(ingest_s, 2),
            "sync_s": round(health["sync_s"], 2),
            "devices_counted": health["retained_devices"],
            "retained_reports": health["ingest"]["retained"],
            "ingest_reports_per_s": round(health["ingest"]["retained"] / health["sync_s"], 1),
            "fleet_page_ms": round(page_ms, 1),
            "fleet_filtered_ms": round(filtered_ms, 1),
            "rollout_state": done["state"],
            "rollout_reason": done["reason"],
            "rollout_s": round(rollout_s, 2),
            "rollout_totals": done["totals"],
        }
    finally:
        if hub is not None and hub.process is not None:
            hub.stop(signal.SIGTERM)
        await asyncio.gather(*(d.stop() for d in devices))
        broker.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=200)
    parser.add_argument("--db", default="", help="database URL (default: a SQLite file)")
    parser.add_argument("--fail-pct", type=float, default=0.0, help="share that fails (random)")
    parser.add_argument("--abort-threshold", type=float, default=20.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # not the simulated devices' failure warnings
    with tempfile.TemporaryDirectory(prefix="edgeagent-bench-fleet-") as tmp:
        result = asyncio.run(bench(args, Path(tmp)))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for key, value in result.items():
            print(f"{key:<24} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
