"""The dashboard's deployment page and the deployment answer over a real app and a real SQLite
database, without a broker or a browser: rows are written with the hub's own functions, and a
change lands exactly during a read (a SQLAlchemy cursor event), which no timing can promise.

- The version a page or an answer carries is the one from before its read, so a change
  committed during the read is not lost (it missed the final change for >= 15 s, 2 of 7 runs).
- A new process's version is above the old one's: a restart reads as a change.
- Devices never sent (queued in an ended deployment, ``not_sent``) say "not sent"; a status
  the dashboard does not know is shown as it is; ``?only=failures`` keeps the failures.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
import sqlalchemy as sa
from aiohttp import web

from devtools.hub_fleet import make_release
from edgeagent.fleet.manifest import parse_manifest
from edgeagent.fleet.signing import decode_envelope
from edgeagent.hub.policy import StagedPolicy
from edgeagent.hub.server import deploydb, fleetdb, releasedb, targets
from edgeagent.hub.server.api import HubContext, create_app
from edgeagent.hub.server.auth import Tokens
from edgeagent.hub.server.changes import Changes
from edgeagent.hub.server.database import open_engine, upgrade
from edgeagent.hub.server.ingest import Incoming, Ingest, SyncMarker
from edgeagent.hub.server.schema import deployment_devices, deployments
from edgeagent.hub.server.settings import ServerSettings

pytestmark = pytest.mark.timeout(60)


@dataclass
class Hub:
    url: str
    context: HubContext
    deployment_id: str


async def _deployment(context: HubContext, devices: int, stages: list[float]) -> str:
    envelope = make_release("2.0.0")
    manifest = parse_manifest(decode_envelope(envelope, max_bytes=len(envelope)).payload)
    rows = [
        {"device_id": f"dev-{i:03d}", "group_name": "lab", "last_seen": 1.7e9}
        for i in range(devices)
    ]
    async with context.engine.begin() as connection:
        await fleetdb.upsert_devices(connection, rows)
        release, _ = await releasedb.add_release(connection, envelope, manifest)
        return await deploydb.create_deployment(
            connection,
            release,
            targets.TargetSpec(group="lab"),
            StagedPolicy(stages_pct=tuple(stages), abort_threshold_pct=50.0),
        )


@pytest.fixture(name="hub")
async def hub_fixture(tmp_path: Path) -> AsyncIterator[Hub]:
    engine = open_engine(f"sqlite:///{tmp_path / 'hub.db'}")
    await upgrade(engine)
    ingest = SimpleNamespace(synced=asyncio.Event())  # what the API reads of the ingest
    context = HubContext(engine, ServerSettings(), ingest, Changes(), lambda: None)  # type: ignore[arg-type]
    runner = web.AppRunner(create_app(context, Tokens({}, open=True)))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        deployment_id = await _deployment(context, 4, [50, 100])
        yield Hub(f"http://127.0.0.1:{runner.addresses[0][1]}", context, deployment_id)
    finally:
        await runner.cleanup()
        await engine.dispose()


async def _get(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.text()


def _bump_during_the_first_read_of_deployments(hub: Hub, table: str = "deployments") -> list[int]:
    """As if the controller committed a change and bumped the version right after the first
    statement that reads ``table`` ran; returns the versions it bumped past."""
    bumped: list[int] = []

    def after(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if not bumped and f"FROM {table}" in statement:
            bumped.append(hub.context.changes.version)
            hub.context.changes.version += 1  # no waiter to notify: a plain bump

    sa.event.listen(hub.context.engine.sync_engine, "after_cursor_execute", after)
    return bumped


def _page_data(text: str) -> dict[str, Any]:
    found = re.search(r"const page = (\{.*?\});\n", text)
    assert found, text[-2000:]
    return json.loads(found.group(1))


async def test_the_api_answer_carries_the_version_from_before_its_read(hub: Hub) -> None:
    bumped = _bump_during_the_first_read_of_deployments(hub)
    status, text = await _get(f"{hub.url}/api/v1/deployments/{hub.deployment_id}")
    assert status == 200, text
    assert bumped, "the read did not happen"
    # a client polling after this version is answered at once, with the change
    assert json.loads(text)["version"] == bumped[0] != hub.context.changes.version


@pytest.mark.parametrize("path", ["/api/v1/devices", "/api/v1/devices/dev-000"])
async def test_the_fleet_answers_carry_the_version_from_before_their_read(
    hub: Hub, path: str
) -> None:
    bumped = _bump_during_the_first_read_of_deployments(hub, table="devices")
    status, text = await _get(f"{hub.url}{path}")
    assert status == 200, text
    assert bumped and json.loads(text)["version"] == bumped[0] != hub.context.changes.version


async def test_the_page_carries_the_version_from_before_its_read(hub: Hub) -> None:
    bumped = _bump_during_the_first_read_of_deployments(hub)
    status, text = await _get(f"{hub.url}/ui/deployments/{hub.deployment_id}")
    assert status == 200, text
    assert bumped and _page_data(text)["seen"] == bumped[0] != hub.context.changes.version


def test_a_new_process_counts_on_from_above_the_old_one() -> None:
    old = Changes()
    old.version += 1000  # a long life: many changes
    new = Changes(start=old.epoch + 1001)  # started later (its clock: microseconds)
    assert new.version > old.version
    assert Changes().version > 1000  # the real clock: never 0, which a reset would give


async def _set_status(hub: Hub, status: dict[str, str]) -> None:
    async with hub.context.engine.begin() as connection:
        for device_id, value in status.items():
            await connection.execute(
                deployment_devices.update()
                .where(deployment_devices.c.device_id == device_id)
                .values(status=value, answered_at=1.7e9 if value != "queued" else None)
            )
        await connection.execute(deployments.update().values(state="aborted", stage=1))


def _rows(text: str) -> dict[str, str]:
    """device id → its status cell, from the outcomes table."""
    body = text.split("id='outcomes'", 1)[1].split("</table>", 1)[0]
    cells = re.findall(
        r"<tr><td><a href='/ui/devices/([^']+)'>[^<]*</a></td><td>\d+</td><td>(.*?)</td>", body
    )
    return {device: re.sub(r"<[^>]+>", "", cell) for device, cell in cells}


async def test_never_sent_and_unknown_statuses_and_the_failures_filter(hub: Hub) -> None:
    await _set_status(
        hub, {"dev-000": "failed", "dev-001": "not_sent", "dev-002": "queued", "dev-003": "weird"}
    )
    status, text = await _get(f"{hub.url}/ui/deployments/{hub.deployment_id}")
    assert status == 200, text
    assert _rows(text) == {
        "dev-000": "failed",
        "dev-001": "not sent",
        "dev-002": "not sent",  # queued in an ended deployment: never sent
        "dev-003": "weird",  # unknown to this dashboard: shown as it is
    }
    stages = text.split("id='stages'", 1)[1].split("</table>", 1)[0]
    # stage 1 (dev-000, dev-001): 1 failed, 1 not sent; stage 2: 1 not sent + 1 unknown
    assert "<td>1</td><td>2</td><td>0</td><td>1</td><td>0</td><td>0</td><td>1</td>" in stages
    assert "<td>2</td><td>2</td><td>0</td><td>0</td><td>0</td><td>0</td><td>2</td>" in stages
    assert "abort when at least 50 %" in text and "Stages 50 % → 100 %" in text
    assert _page_data(text)["retry"]["devices"] == ["dev-000"]
    assert "id='retry'" in text

    status, text = await _get(f"{hub.url}/ui/deployments/{hub.deployment_id}?only=failures")
    assert status == 200 and _rows(text) == {"dev-000": "failed"}
    assert "devices 1–1 of 1 failed or timed out" in text


async def test_device_ids_cannot_end_the_page_script(hub: Hub) -> None:
    hostile = "</script><script>alert(1)</script>"
    async with hub.context.engine.begin() as connection:
        await fleetdb.upsert_devices(
            connection, [{"device_id": hostile, "group_name": "lab", "last_seen": 1.7e9}]
        )
        await connection.execute(deployments.update().values(state="aborted"))
        await connection.execute(
            deployment_devices.insert().values(
                deployment_id=hub.deployment_id, device_id=hostile, stage=1, status="failed"
            )
        )
    status, text = await _get(f"{hub.url}/ui/deployments/{hub.deployment_id}")
    assert status == 200
    assert hostile not in text and text.count("<script") == 1
    assert hostile in _page_data(text)["retry"]["devices"]


# ---- a device's charts, from state reports stored by the hub's own ingest ------------------


async def _ingest_reports(context: HubContext, reports: list[dict[str, Any]]) -> None:
    """Store each report as the ingest loop does, one at a time (each is its own history
    row, at its own hub time), waiting on the ingest's sync marker rather than a clock."""
    ingest = Ingest(context.engine, "edgeagent", max_report_bytes=65536)
    task = asyncio.create_task(ingest.run())
    try:
        for number, report in enumerate(reports):
            ingest.synced.clear()
            ingest.expect_sync(f"sync-{number}")
            payload = json.dumps(report).encode()
            await ingest.submit(Incoming("edgeagent/device/dev-000/state", payload, False))
            await ingest.submit(SyncMarker(f"sync-{number}"))
            await ingest.synced.wait()
        assert ingest.stats["skipped"] == 0
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _state(at: float, requests: int, errors: int, p95: float, celsius: float) -> dict[str, Any]:
    traffic = {"requests": requests, "errors": errors, "p50_ms": p95 / 3, "p95_ms": p95}
    return {
        "group": "lab",
        "updated_at": at,
        "models": {"det": {"active_version": "1", "versions": {"1": {}}, "traffic": traffic}},
        "governor": {"state": "normal", "temperatures": [{"sensor": "cpu", "celsius": celsius}]},
    }


async def test_the_device_page_charts_throughput_errors_and_latency(hub: Hub) -> None:
    # 60 s apart on the device's clock: 120, then 600 requests (10/s), 6 of them failed (1 %)
    await _ingest_reports(
        hub.context,
        [
            _state(1000.0, 5000, 7, 30.0, 50.0),  # older than --chart-points keeps
            _state(1060.0, 5120, 7, 30.0, 51.0),
            _state(1120.0, 5720, 13, 45.0, 55.0),
        ],
    )
    hub.context.settings = replace(hub.context.settings, chart_points=2)
    status, text = await _get(f"{hub.url}/ui/devices/dev-000")
    assert status == 200, text
    assert "From the newest 2 state reports" in text
    for chart in ("temperature", "throughput", "errors", "latency"):
        assert f"<svg id='{chart}' class='chart'" in text, chart
    throughput = text.split("<svg id='throughput'", 1)[1].split("</svg>", 1)[0]
    # two points: the older one's rate is taken from the report before it (read, not drawn)
    assert throughput.count("<polyline") == 1 and "points='0.0," in throughput
    assert "11 req/s" in throughput  # the axis: 10/s and a tenth
    temperature = text.split("<svg id='temperature'", 1)[1].split("</svg>", 1)[0]
    assert "50 °C" in temperature and "49 °C" not in temperature  # 51 and 55 °C, not 50
    models = text.split("id='models'", 1)[1].split("</table>", 1)[0]
    assert "<td>10 /s</td><td>1 %</td><td>15 ms / 45 ms</td>" in models


async def test_a_device_without_traffic_says_so_instead_of_charting(hub: Hub) -> None:
    status, text = await _get(f"{hub.url}/ui/devices/dev-001")
    assert status == 200, text
    for chart in ("temperature", "throughput", "errors", "latency"):
        assert f"id='{chart}-empty'" in text and f"<svg id='{chart}'" not in text


# ---- what a read-only session sees, and what the server lets it do -------------------------

READ, ADMIN = "r" * 24, "a" * 24


@pytest.fixture(name="signed")
async def signed_fixture(hub: Hub) -> AsyncIterator[str]:
    """The same hub's data behind a second app that takes a read and an admin token."""
    tokens = Tokens({READ: "read", ADMIN: "admin"})
    runner = web.AppRunner(create_app(hub.context, tokens))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def _session(url: str, token: str) -> aiohttp.ClientSession:
    session = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))
    async with session.post(f"{url}/login", data={"token": token}) as response:
        assert response.status == 200, await response.text()
    return session


WRITES = ("id='create-form'", "id='create'", "data-action=", "id='rollback'", "id='retry'")


async def _page(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url) as response:
        assert response.status == 200
        return await response.text()


async def _post(
    session: aiohttp.ClientSession, url: str, csrf: str, body: Any = None
) -> tuple[int, dict[str, Any]]:
    async with session.post(url, json=body, headers={"X-CSRF-Token": csrf}) as response:
        return response.status, await response.json()


async def test_a_read_only_session_sees_no_actions_and_is_refused_them(
    hub: Hub, signed: str
) -> None:
    envelope = make_release("1.5.0")  # another stored version: what "Roll back" offers
    manifest = parse_manifest(decode_envelope(envelope, max_bytes=len(envelope)).payload)
    async with hub.context.engine.begin() as connection:
        await releasedb.add_release(connection, envelope, manifest)
    path = f"/ui/deployments/{hub.deployment_id}"
    api = f"{signed}/api/v1/deployments/{hub.deployment_id}"
    reader, admin = await _session(signed, READ), await _session(signed, ADMIN)
    async with reader, admin:
        shown = await _page(admin, f"{signed}{path}")  # control: an admin has every button
        assert all(w in shown for w in ("data-action='abort'", "id='rollback'")), shown
        listing = await _page(admin, f"{signed}/ui/deployments")
        assert all(w in listing for w in WRITES[:2])
        for page in (f"{signed}{path}", f"{signed}/ui/deployments"):
            text = await _page(reader, page)
            assert "id='read-only'" in text and not [w for w in WRITES if w in text], page
        # even with the page's CSRF token (its data carries one whatever the scope) the
        # server refuses a read session's actions, on the scope
        csrf = _page_data(await _page(reader, f"{signed}{path}"))["csrf"]
        assert csrf
        for action, body in (("rollback", {"version": "1.5.0"}), ("abort", None)):
            status, answer = await _post(reader, f"{api}/{action}", csrf, body)
            assert (status, answer["error"]) == (403, "this needs a token with admin scope")
        status, answer = await _post(
            reader, f"{signed}/api/v1/deployments", csrf, {"release_id": 1, "group": "lab"}
        )
        assert status == 403, answer
        async with reader.get(api) as response:
            assert (await response.json())["state"] == "scheduled"  # nothing happened
        status, answer = await _post(
            admin, f"{api}/abort", _page_data(shown)["csrf"]
        )  # control: the same request with an admin session
        assert (status, answer["state"]) == (200, "aborted"), answer


@pytest.mark.parametrize("points", ["1", "100001"])
def test_chart_points_is_a_flag_checked_at_start(tmp_path: Path, points: str) -> None:
    started = subprocess.run(
        [
            *(sys.executable, "-m", "edgeagent.cli", "hub", "server", "--chart-points", points),
            *("--db", f"sqlite:///{tmp_path / 'hub.db'}", "--state-dir", str(tmp_path)),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert started.returncode == 2, started.stdout + started.stderr
    assert "--chart-points must be 2..100000" in started.stderr
    assert not (tmp_path / "hub.db").exists()
