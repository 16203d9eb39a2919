"""The fleet scenario ``scripts/bench_fleet.py`` times and the simulator test checks.

N simulated devices (``sim_fleet``: the agent's real update client, a stub in place of model
load and inference) in worker processes, one Mosquitto — or two joined by a bridge, the
devices on B and the hub on A — the real ``edgeagent hub server`` process (signing each
stage's envelopes with the release key) and ``hub serve`` for the artifacts. Phases:

1. **connect**: every device opens its MQTT session and publishes its retained state;
2. **sync**: the hub server starts and reads every retained report (reports/s, its CPU);
3. **fan-out**: release 1.0.0 is published retained on the group's topic (``hub publish``);
   every device verifies, downloads, installs and commits it; the hub sees all of them;
4. **fleet query**: ``GET /api/v1/devices`` (a page, a filtered page) and the dashboard page;
5. **rollout**: 2.0.0 through the hub server, stages 1 % → 10 % → 100 %, abort threshold;
6. **abort**: 3.0.0 fails the health check on ``fail_pct`` % of the devices: stage 1 aborts
   it and no device of a later stage receives it.

``run_scenario`` returns the figures and the facts to check (counts, states, results); it
asserts nothing itself, so the test and the benchmark each decide what must hold.
"""

from __future__ import annotations

import signal
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import psutil

from devtools.broker import Broker
from devtools.hub_fleet import Api, HubProcess
from devtools.release_site import MODEL, ReleaseSite
from devtools.sim_fleet import SimFleet, plan_devices
from edgeagent.fleet.topics import GroupTopics
from edgeagent.hub.publish import publish

GROUP = "bench"
STUB_NOTE = (
    "devices run the agent's real update client (UpdateService: MQTT link, reporter, "
    "verify, HTTP download + SHA-256, unpack, install, health check, commit); model load and "
    "inference are a stub (StubRegistry), not a runtime"
)


@dataclass(frozen=True)
class ScenarioOptions:
    devices: int
    workers: int
    db: str = ""  # default: a SQLite file in the work directory
    bridge: bool = False  # devices on broker B, hub on broker A, joined by a bridge
    fail_pct: float = 30.0
    abort_threshold_pct: float = 20.0
    stages_pct: tuple[float, ...] = (1.0, 10.0, 100.0)
    wait_s: float = 600.0  # bound on every phase (a hang becomes a failure, not a figure)
    query_rounds: int = 20
    state_root: Path | None = None  # the devices' state directories (default: work dir)


class Stopwatch:
    """Wall time and the hub server process's CPU time over one phase."""

    def __init__(self, pid: int | None = None) -> None:
        self.process = psutil.Process(pid) if pid is not None else None
        self.start = time.perf_counter()
        self.cpu = self._cpu()

    def _cpu(self) -> float:
        if self.process is None:
            return 0.0
        times = self.process.cpu_times()
        return times.user + times.system

    def read(self) -> dict[str, float]:
        wall = time.perf_counter() - self.start
        cpu = self._cpu() - self.cpu
        return {"s": round(wall, 3), "hub_cpu_s": round(cpu, 2), "hub_cpu_pct": _pct(cpu, wall)}


def _pct(part: float, whole: float) -> float:
    return round(100.0 * part / whole, 1) if whole else 0.0


async def _median_ms(call: Callable[[], Awaitable[object]], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        await call()
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1000, 1)


async def _page(url: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        assert response.status == 200, response.status
        return await response.text()


async def wait_for_fleet(api: Api, count: int, wait_s: float, **where: str) -> int:
    """Long-poll the hub's device list until ``count`` devices match ``where`` (or wait_s)."""
    query = "&".join(f"{k}={v}" for k, v in where.items())
    deadline = time.monotonic() + wait_s
    page = await api.call("GET", f"/api/v1/devices?limit=1&{query}")
    while page["total"] < count and (left := deadline - time.monotonic()) > 0:
        page = await api.call(
            "GET",
            f"/api/v1/devices?limit=1&{query}&wait={min(left, 30):.1f}&after={page['version']}",
        )
    return int(page["total"])


def _merge(answers: list[dict[str, Any]]) -> dict[str, Any]:
    """The workers' answers to one ``await`` as one fleet-wide answer."""
    results: dict[str, int] = {}
    serving: dict[str, int] = {}
    for answer in answers:
        for key, value in answer["results"].items():
            results[key] = results.get(key, 0) + value
        for key, value in answer["serving"].items():
            serving[key] = serving.get(key, 0) + value

    def pick(name: str, choose: Callable[..., float]) -> float | None:
        values = [a[name] for a in answers if a[name] is not None]
        return choose(values) if values else None

    return {
        "verified": sum(a["verified"] for a in answers),
        "first_verified": pick("first_verified", min),
        "last_received": pick("last_received", max),
        "last_verified": pick("last_verified", max),
        "last_ended": pick("last_ended", max),
        "results": results,
        "missing": sum(a["missing"] for a in answers),
        "serving": serving,
        "worker_cpu_s": round(sum(a["command_cpu_s"] for a in answers), 2),
    }


def _usage(answers: list[dict[str, Any]], devices: int) -> dict[str, Any]:
    """Memory and CPU the simulator's processes used, per device."""
    rss = sum(a["rss_bytes"] - a["baseline_rss_bytes"] for a in answers)
    return {
        "worker_processes": len(answers),
        "rss_per_device_kib": round(rss / devices / 1024, 1),
        "worker_rss_mib": round(sum(a["rss_bytes"] for a in answers) / 2**20),
        "connect_cpu_per_device_ms": round(
            1000 * sum(a["command_cpu_s"] for a in answers) / devices, 2
        ),
    }


async def _deploy(api: Api, version: str, options: ScenarioOptions) -> dict[str, Any]:
    created = await api.call(
        "POST",
        "/api/v1/deployments",
        expect=201,
        json={
            "model": MODEL,
            "version": version,
            "group": GROUP,
            "stages_pct": list(options.stages_pct),
            "abort_threshold_pct": options.abort_threshold_pct,
            "stage_timeout_s": options.wait_s,
        },
    )
    return await api.all_devices(await api.until(created["id"], "succeeded", "aborted"))


async def run_scenario(options: ScenarioOptions, workdir: Path) -> dict[str, Any]:
    """Run every phase (module docstring); returns figures and facts, asserts nothing."""
    hub_broker = Broker(workdir / "broker-a", max_queued_messages=100_000)
    device_broker = (
        Broker(workdir / "broker-b", bridge_to=hub_broker, max_queued_messages=100_000)
        if options.bridge
        else hub_broker
    )
    site = ReleaseSite(workdir / "site")
    # thousands of sessions on one loop answer pings late: a test-sized keep-alive would
    # have the broker drop them
    timing = {"keepalive_s": 300, "connect_timeout_s": 120.0, "reconnect_max_s": 10.0}
    hub_mqtt = hub_broker.settings(**timing)
    device_mqtt = device_broker.settings(**timing)
    envelopes = {version: site.sign(version) for version in ("1.0.0", "2.0.0", "3.0.0")}
    devices = plan_devices(options.devices, GROUP, fail_version="3.0.0", fail_pct=options.fail_pct)
    fleet = SimFleet(
        devices,
        options.workers,
        mqtt=device_mqtt,
        trust_file=site.trust_file,
        state_root=options.state_root or workdir / "devices",
    )
    hub: HubProcess | None = None
    result: dict[str, Any] = {
        "devices": options.devices,
        "note": STUB_NOTE,
        "brokers": "two Mosquittos joined by a bridge" if options.bridge else "one Mosquitto",
    }
    try:
        hub_broker.start()
        if device_broker is not hub_broker:
            device_broker.start()
        site.start()
        started = await fleet.start()
        result["open_files_limit"] = min(s["open_files_limit"] for s in started)

        clock = Stopwatch()
        connected = await fleet.call("connect")
        result["connect"] = {**clock.read(), **_usage(connected, options.devices)}
        del result["connect"]["hub_cpu_s"], result["connect"]["hub_cpu_pct"]

        db = options.db or f"sqlite:///{workdir / 'hub.db'}"
        hub = HubProcess(
            db,
            hub_mqtt,
            *("--max-page-size", "1000", "--log-level", "WARNING"),
            *("--release-key", str(site.release_key), "--trust", str(site.trust_file)),
        )
        launched = time.perf_counter()
        api = Api(await hub.start())
        assert hub.process is not None
        clock = Stopwatch(hub.process.pid)
        health = await api.call("GET", f"/api/v1/health?wait={options.wait_s}")
        result["sync"] = {"synced": health["synced"]}
        if not health["synced"]:
            return result  # the facts say what went wrong; no later phase can run
        retained = health["ingest"]["retained"]
        result["sync"] |= {
            **clock.read(),
            "hub_start_to_synced_s": round(time.perf_counter() - launched, 2),
            "database": health["database"],
            "devices_counted": health["retained_devices"],
            "retained_reports": retained,
            "reports_per_s": round(retained / health["sync_s"], 1) if health["sync_s"] else None,
        }

        received = health["ingest"]["received"]
        clock = Stopwatch(hub.process.pid)
        published = time.time()
        await publish(
            hub_mqtt, [GroupTopics(hub_mqtt.topic_prefix, GROUP).release(MODEL)], envelopes["1.0.0"]
        )
        ended = _merge(await fleet.call("await", MODEL, "1.0.0", options.wait_s))
        installed = ended["results"].get("succeeded", 0)  # the hub must see each of them
        seen = await wait_for_fleet(api, installed, options.wait_s, model=MODEL, version="1.0.0")
        window = clock.read()
        health = await api.call("GET", "/api/v1/health")
        reports = health["ingest"]["received"] - received
        result["fanout"] = {
            "verified_devices": ended["verified"],
            "results": ended["results"],
            "missing": ended["missing"],
            "serving": ended["serving"],
            "publish_to_all_received_s": _since(published, ended["last_received"]),
            "publish_to_first_verified_s": _since(published, ended["first_verified"]),
            "publish_to_all_verified_s": _since(published, ended["last_verified"]),
            "publish_to_all_installed_s": _since(published, ended["last_ended"]),
            "hub_devices_on_new_version": seen,
            "publish_to_hub_saw_all_s": window["s"],
            "hub_reports": reports,
            "hub_ingest_reports_per_s": round(reports / window["s"], 1),
            "hub_cpu_s": window["hub_cpu_s"],
            "hub_cpu_pct": window["hub_cpu_pct"],
            "simulator_cpu_s": ended["worker_cpu_s"],
            "simulator_cpu_per_install_ms": round(
                1000 * ended["worker_cpu_s"] / max(1, options.devices), 2
            ),
        }

        rounds = options.query_rounds
        result["fleet_query_ms"] = {
            "rest_page_100": await _median_ms(
                lambda: api.call("GET", "/api/v1/devices?limit=100"), rounds
            ),
            "rest_filtered_model_version": await _median_ms(
                lambda: api.call("GET", f"/api/v1/devices?model={MODEL}&version=1.0.0&limit=100"),
                rounds,
            ),
            "html_fleet_page": await _median_ms(lambda: _page(f"{api.url}/"), rounds),
            "html_filtered": await _median_ms(
                lambda: _page(f"{api.url}/?group={GROUP}&model={MODEL}&version=1.0.0"), rounds
            ),
            "rounds": rounds,
        }

        for version in ("2.0.0", "3.0.0"):
            await api.call("POST", "/api/v1/releases", expect=201, data=envelopes[version])
        clock = Stopwatch(hub.process.pid)
        done = await _deploy(api, "2.0.0", options)
        result["rollout"] = {**clock.read(), **_deployment_facts(done)}
        ended = _merge(await fleet.call("await", MODEL, "2.0.0", options.wait_s))
        result["rollout"]["device_results"] = ended["results"]
        result["rollout"]["serving"] = ended["serving"]

        clock = Stopwatch(hub.process.pid)
        done = await _deploy(api, "3.0.0", options)
        result["abort"] = {
            **clock.read(),
            **_deployment_facts(done),
            "fail_pct": options.fail_pct,
            "abort_threshold_pct": options.abort_threshold_pct,
        }
        reached = sum(1 for d in done["devices"] if d["status"] not in ("queued", "not_sent"))
        ended = _merge(await fleet.call("await", MODEL, "3.0.0", 0.0))
        result["abort"]["devices_reached"] = reached
        result["abort"]["device_results"] = ended["results"]
        result["abort"]["serving"] = ended["serving"]
        return result
    finally:  # each part stopped even when stopping another failed (no process left behind)
        try:
            await fleet.stop()
        finally:
            try:
                if hub is not None and hub.process is not None:
                    hub.stop(signal.SIGTERM)
            finally:
                site.stop()
                for broker in {id(b): b for b in (device_broker, hub_broker)}.values():
                    broker.stop()


def _since(start: float, end: float | None) -> float | None:
    return None if end is None else round(end - start, 3)


def _deployment_facts(done: dict[str, Any]) -> dict[str, Any]:
    """What a finished deployment says about itself, and what it recorded per device."""
    devices = done["devices"]
    return {
        "state": done["state"],
        "reason": done["reason"],
        "stage": done["stage"],
        "totals": done["totals"],
        "stages": [{k: v for k, v in s.items() if v} for s in done["stages"]],
        "sent_with_envelope_record": sum(
            1 for d in devices if d["status"] != "queued" and d.get("envelope_sha256")
        ),
        "distinct_envelopes": len({d.get("envelope_sha256") for d in devices} - {None}),
    }
