"""The replica scenario ``scripts/bench_fleet.py --replicas N`` runs: the leader dies mid-rollout.

N simulated devices (``sim_fleet``: the agent's real update client) and ``--replicas`` real
``edgeagent hub server`` processes on one PostgreSQL database (each its own MQTT session, all
signing with the release key), one Mosquitto, ``hub serve`` for the artifacts. A rollout of
2.0.0, stages 10 % → 50 % → 100 %, is created through one replica; when 30 % of the devices
have been sent it, the replica leading the controller is SIGKILLed. Figures:

- ``takeover_s``: kill → another replica holds the controller's lease (the leases row, polled);
- ``resume_s``: kill → the first device marked sent by the new leader (its ``sent_at``);
- ``direct_releases``: how many devices received the hub's envelope how many times, as the
  devices counted them (``{1: N}``: every device exactly once);
- lost reports: devices whose answer the hub does not hold (the deployment's ``succeeded``
  count and the fleet table's devices on 2.0.0, against N).

``run_replica_scenario`` returns the figures and facts; it asserts nothing.
"""

from __future__ import annotations

import asyncio
import collections
import signal
import time
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from devtools.broker import Broker
from devtools.fleet_scenario import GROUP, STUB_NOTE, wait_for_fleet
from devtools.hub_fleet import Api
from devtools.hub_replicas import Replica, leader, replicas
from devtools.release_site import MODEL, ReleaseSite
from devtools.sim_fleet import SimFleet, plan_devices
from devtools.waiting import until
from edgeagent.hub.server.schema import deployment_devices as dd
from edgeagent.hub.server.settings import normalise_database_url

KILL_AT = 0.30  # of the devices sent to
STAGES = (10.0, 50.0, 100.0)


async def _reached(engine: Any, deployment_id: str) -> int:
    async with engine.connect() as connection:
        found = await connection.scalar(
            sa.select(sa.func.count())
            .select_from(dd)
            .where(dd.c.deployment_id == deployment_id, dd.c.sent_at.is_not(None))
        )
    return int(found or 0)


async def _first_sent_after(engine: Any, deployment_id: str, moment: float) -> float | None:
    async with engine.connect() as connection:
        found = await connection.scalar(
            sa.select(sa.func.min(dd.c.sent_at)).where(
                dd.c.deployment_id == deployment_id, dd.c.sent_at > moment
            )
        )
    return None if found is None else float(found)


async def run_replica_scenario(
    devices: int,
    workers: int,
    replica_count: int,
    database_url: str,
    workdir: Path,
    *,
    state_root: Path,
    wait_s: float = 600.0,
) -> dict[str, Any]:
    """Run it (module docstring); returns figures and facts, asserts nothing."""
    broker = Broker(workdir / "broker", max_queued_messages=100_000)
    site = ReleaseSite(workdir / "site")
    timing = {"keepalive_s": 300, "connect_timeout_s": 120.0, "reconnect_max_s": 10.0}
    mqtt = broker.settings(**timing)
    envelope = site.sign("2.0.0")
    fleet = SimFleet(
        plan_devices(devices, GROUP),
        workers,
        mqtt=mqtt,
        trust_file=site.trust_file,
        state_root=state_root,
    )
    engine = create_async_engine(normalise_database_url(database_url))
    result: dict[str, Any] = {
        "devices": devices,
        "replicas": replica_count,
        "note": STUB_NOTE,
        "stages_pct": list(STAGES),
        "kill_at_pct": KILL_AT * 100,
    }
    extra = (
        *("--max-page-size", "1000", "--log-level", "WARNING"),
        *("--release-key", str(site.release_key), "--trust", str(site.trust_file)),
    )
    try:
        broker.start()
        site.start()
        await fleet.start()
        await fleet.call("connect")
        async with replicas(database_url, mqtt, replica_count, *extra) as group:
            apis = {name: Api(r.url) for name, r in group.items()}
            await asyncio.gather(
                *(api.call("GET", f"/api/v1/health?wait={wait_s}") for api in apis.values())
            )
            first = next(iter(apis.values()))
            await first.call("POST", "/api/v1/releases", expect=201, data=envelope)
            started = time.perf_counter()
            created = await first.call(
                "POST",
                "/api/v1/deployments",
                expect=201,
                json={
                    "model": MODEL,
                    "version": "2.0.0",
                    "group": GROUP,
                    "stages_pct": list(STAGES),
                    "stage_timeout_s": wait_s,
                },
            )
            deployment_id = created["id"]

            async def reached_kill_point() -> bool:
                return await _reached(engine, deployment_id) >= KILL_AT * devices

            await until(reached_kill_point, wait_s, poll_s=0.01, what="30 % sent")
            old_name, token = await leader(database_url)
            old: Replica = group[old_name]
            killed = time.time()
            old.stop(signal.SIGKILL)
            at_kill = await _reached(engine, deployment_id)
            new: list[tuple[str, int]] = []

            async def taken_over() -> bool:
                new[:] = [await leader(database_url)]
                return new[0][1] != token

            await until(taken_over, wait_s, poll_s=0.05, what="a new leader")
            takeover = time.time() - killed
            survivor = apis[new[0][0]]
            done = await survivor.until(deployment_id, "succeeded", "aborted")
            rollout_s = time.perf_counter() - started
            answers = await fleet.call("await", MODEL, "2.0.0", wait_s)
            first_after = await _first_sent_after(engine, deployment_id, killed)
            on_new = await wait_for_fleet(survivor, devices, 60.0, model=MODEL, version="2.0.0")
            direct: collections.Counter[int] = collections.Counter()
            for answer in answers:
                direct.update({int(k): v for k, v in answer["direct_releases"].items()})
            result |= {
                "state": done["state"],
                "totals": done["totals"],
                "killed_leader": old_name,
                "new_leader": new[0][0],
                "sent_at_kill": at_kill,
                "takeover_s": round(takeover, 2),
                "resume_s": None if first_after is None else round(first_after - killed, 2),
                "rollout_s": round(rollout_s, 2),
                "direct_releases": dict(sorted(direct.items())),
                "device_results": dict(
                    sum(
                        (collections.Counter(a["results"]) for a in answers),
                        collections.Counter(),
                    )
                ),
                "devices_missing_an_end": sum(a["missing"] for a in answers),
                "hub_devices_on_2_0_0": on_new,
                "lost_reports": devices - min(done["totals"]["succeeded"], on_new),
            }
        return result
    finally:
        try:
            await fleet.stop()
        finally:
            await engine.dispose()
            site.stop()
            broker.stop()
