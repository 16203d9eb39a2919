#!/usr/bin/env python3
"""Fleet benchmark of the hub server: N simulated devices in worker processes, each
a real MQTT session running the agent's real update client (``UpdateService``: link, reporter,
verify, download from ``hub serve`` with the SHA-256 check, unpack, install, health check,
commit) with only model load and inference stubbed; the real ``edgeagent hub server`` process
signing each stage's envelopes; one Mosquitto, or two joined by a bridge (``--bridge``).

Figures (see ``devtools/fleet_scenario.py`` for the phases): connect time and the simulator's
memory and CPU per device; the hub's sync of the retained reports (reports/s, hub CPU);
release fan-out (publish → every device received / verified / installed it, and the hub saw
it, with the hub's ingest rate and CPU meanwhile); fleet-table query time (REST and the
dashboard's HTML, median of ``--rounds``); a staged rollout 1 % → 10 % → 100 % until every
device answered; and a release that fails on ``--fail-pct`` % of devices, aborted in stage 1.

    python scripts/bench_fleet.py --devices 10000 [--workers 4] [--bridge]
        [--db postgresql://…] [--json]

``--replicas N`` runs the replica scenario instead (``devtools/replica_scenario.py``): N hub
servers on one PostgreSQL (``--db``, or a throwaway cluster of the test suite's kind), the
leader SIGKILLed at 30 % of a rollout; it reports how soon another replica took over and
resumed, how many envelopes each device received and how many answers the hub lost.

    python scripts/bench_fleet.py --devices 1000 --replicas 3 [--db postgresql://…]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the simulator lives in devtools/, beside the tests' doubles

from devtools.fleet_scenario import ScenarioOptions, run_scenario  # noqa: E402
from devtools.replica_scenario import run_replica_scenario  # noqa: E402
from devtools.sim_worker import raise_open_files_limit  # noqa: E402

DEVICES_PER_WORKER = 2500


def _print(result: dict, indent: str = "") -> None:
    for key, value in result.items():
        if isinstance(value, dict) and key not in ("results", "totals", "serving"):
            print(f"{indent}{key}:")
            _print(value, indent + "  ")
        else:
            print(f"{indent}{key:<34} {value}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=1000)
    parser.add_argument(
        "--workers", type=int, default=0, help=f"default: one per {DEVICES_PER_WORKER} devices"
    )
    parser.add_argument("--db", default="", help="database URL (default: a SQLite file)")
    parser.add_argument("--bridge", action="store_true", help="devices on broker B, hub on A")
    parser.add_argument("--fail-pct", type=float, default=30.0, help="share failing 3.0.0")
    parser.add_argument("--abort-threshold", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=20, help="fleet queries timed")
    parser.add_argument("--wait", type=float, default=900.0, help="bound on each phase, s")
    parser.add_argument("--replicas", type=int, default=0, help="the replica scenario (N ≥ 2)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)  # not the simulated devices' failure warnings
    open_files = raise_open_files_limit()  # Mosquitto, started from here, inherits it
    if open_files < args.devices + 1000:
        parser.error(f"the open-files limit is {open_files}: raise `ulimit -Hn` first")
    workers = args.workers or max(2, -(-args.devices // DEVICES_PER_WORKER))
    # the devices' state directories on tmpfs when there is one: their fsyncs then cost
    # nothing, and a laptop's disk does not decide the figures
    shm = Path("/dev/shm")
    load_before = os.getloadavg()
    with (
        tempfile.TemporaryDirectory(prefix="edgeagent-bench-fleet-") as work,
        tempfile.TemporaryDirectory(
            prefix="edgeagent-fleet-devices-", dir=shm if shm.is_dir() else None
        ) as states,
    ):
        options = ScenarioOptions(
            devices=args.devices,
            workers=workers,
            db=args.db,
            bridge=args.bridge,
            fail_pct=args.fail_pct,
            abort_threshold_pct=args.abort_threshold,
            wait_s=args.wait,
            query_rounds=args.rounds,
            state_root=Path(states),
        )
        scenario = (
            _replicas(args, workers, Path(work), Path(states))
            if args.replicas
            else run_scenario(options, Path(work))
        )
        result = asyncio.run(scenario)
    result["machine"] = {
        "cpus": os.cpu_count(),
        "load_avg_before": load_before,
        "load_avg_after": os.getloadavg(),
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print(result)
    return 0


async def _replicas(args: argparse.Namespace, workers: int, work: Path, states: Path) -> dict:
    """The replica scenario on ``--db`` (PostgreSQL), or on a throwaway cluster."""
    if args.db:
        return await run_replica_scenario(
            args.devices, workers, args.replicas, args.db, work, state_root=states
        )
    from devtools.postgres import Postgres  # a throwaway cluster, as the tests start

    # its own directory under the system's temporary one: as root the cluster runs as the
    # postgres user, who cannot enter the benchmark's private work directory
    cluster = Postgres(Path(tempfile.mkdtemp(prefix="edgeagent-bench-pg-")))
    cluster.start()
    try:
        url = await asyncio.to_thread(cluster.create_database)
        return await run_replica_scenario(
            args.devices, workers, args.replicas, url, work, state_root=states
        )
    finally:
        cluster.stop()
        shutil.rmtree(cluster.workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
