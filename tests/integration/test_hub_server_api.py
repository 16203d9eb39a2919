"""The hub server's REST API: people's actions on deployments, tokens and scopes, refusals of
bad input (nothing written), the OpenAPI document, and the CLI's ``--server`` mode."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import aiohttp
import pytest
from openapi_spec_validator import validate

from devtools.broker import Broker
from devtools.hub_fleet import Api, fleet, hub_server, make_release, write_tokens
from edgeagent.hub.server.api import HubContext, create_app
from edgeagent.hub.server.auth import Tokens
from edgeagent.hub.server.settings import ServerSettings
from tests.support.postgres import database_url_fixture, postgres_fixture  # noqa: F401

pytestmark = [pytest.mark.broker, pytest.mark.timeout(120)]

READ, ADMIN = "r" * 24, "a" * 24


def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'hub.db'}"


async def test_pause_resume_abort_and_rollback(broker: Broker, database_url: str) -> None:
    settings = broker.settings()
    hold = asyncio.Event()
    async with fleet(settings, 4, hold=hold) as devices, hub_server(database_url, settings) as url:
        api = Api(url)
        await api.synced()
        first, second = devices[:2], devices[2:]

        created = await api.deploy("2.0.0", stages_pct=[50, 100])
        await asyncio.gather(*(d.got_release.wait() for d in first))
        paused = await api.call("POST", f"/api/v1/deployments/{created['id']}/pause")
        assert paused["state"] == "paused"
        await api.call("POST", f"/api/v1/deployments/{created['id']}/pause", expect=409)
        busy = {"model": "mobilenet_v2", "version": "2.0.0", "group": "lab"}
        await api.call("POST", "/api/v1/deployments", expect=409, json=busy)
        hold.set()  # stage 1 answers while paused: recorded, but stage 2 does not start
        found = paused
        while found["totals"]["succeeded"] < 2:
            found = await api.call(
                "GET", f"/api/v1/deployments/{created['id']}?wait=30&after={found['version']}"
            )
        assert found["state"] == "paused" and not any(d.received for d in second)
        await api.call("POST", f"/api/v1/deployments/{created['id']}/resume")
        done = await api.until(created["id"], "succeeded", "aborted")
        assert done["state"] == "succeeded" and done["totals"]["succeeded"] == 4

        # 3.0.0: abort in stage 1, then roll the devices it reached back to 2.0.0
        hold.clear()
        for device in devices:
            device.got_release.clear()
        bad = await api.deploy("3.0.0", stages_pct=[50, 100])
        await asyncio.gather(*(d.got_release.wait() for d in first))
        aborted = await api.call(
            "POST", f"/api/v1/deployments/{bad['id']}/abort", json={"reason": "bad accuracy"}
        )
        assert (aborted["state"], aborted["reason"]) == ("aborted", "bad accuracy")
        await api.call("POST", f"/api/v1/deployments/{bad['id']}/resume", expect=409)
        await api.call(
            "POST",
            f"/api/v1/deployments/{bad['id']}/rollback",
            expect=404,
            json={"version": "9.9.9"},
        )
        # without --release-key the server can only relay 2.0.0's upload, whose serial is
        # below 3.0.0's that devices hold: refused, and nothing changes (issue 23)
        refused = await api.call(
            "POST",
            f"/api/v1/deployments/{bad['id']}/rollback",
            expect=409,
            json={"version": "2.0.0"},
        )
        assert "a rollback needs --release-key" in refused["error"], refused
        assert (await api.call("GET", f"/api/v1/deployments/{bad['id']}"))["state"] == "aborted"
        # 2.0.0 signed again with a serial above 3.0.0's: that upload is re-used
        resigned = make_release("2.0.0", serial=3_000_002)
        await api.call("POST", "/api/v1/releases", expect=201, data=resigned)
        rollback = await api.call(
            "POST",
            f"/api/v1/deployments/{bad['id']}/rollback",
            expect=201,
            json={"version": "2.0.0"},
        )
        assert rollback["rollback_of"] == bad["id"]
        assert [d["device_id"] for d in rollback["devices"]] == ["dev-000", "dev-001"]
        hold.set()
        done = await api.until(rollback["id"], "succeeded", "aborted")
        assert done["state"] == "succeeded"
        assert [d.version for d in devices] == ["2.0.0"] * 4
        assert [m.version for m in second[0].received] == ["2.0.0"]  # never saw 3.0.0
        old = await api.call("GET", f"/api/v1/deployments/{bad['id']}")
        assert old["state"] == "rolled_back"
        listed = await api.call("GET", "/api/v1/deployments?state=rolled_back")
        assert [d["id"] for d in listed["deployments"]] == [bad["id"]]


async def test_tokens_scopes_and_bad_input(broker: Broker, tmp_path: Path) -> None:
    settings = broker.settings()
    tokens = write_tokens(tmp_path / "tokens", read=READ, admin=ADMIN)
    async with (
        fleet(settings, 2),
        hub_server(sqlite_url(tmp_path), settings, token_file=tokens, max_body_bytes=4096) as url,
    ):
        anonymous, reader, admin = Api(url), Api(url, READ), Api(url, ADMIN)
        await anonymous.call("GET", "/api/v1/devices", expect=401)
        await Api(url, "x" * 24).call("GET", "/api/v1/devices", expect=401)
        await reader.synced()
        assert (await reader.call("GET", "/api/v1/devices"))["total"] == 2
        document = await anonymous.call("GET", "/openapi.json")  # public
        assert "/api/v1/deployments" in document["paths"]
        envelope = make_release("2.0.0")
        await reader.call("POST", "/api/v1/releases", expect=403, data=envelope)

        refused = [
            ("POST", "/api/v1/releases", 422, {"data": b"not an envelope"}),
            ("POST", "/api/v1/releases", 413, {"data": b"x" * 5000}),
            ("POST", "/api/v1/deployments", 400, {"data": b"{nope"}),
            ("POST", "/api/v1/deployments", 400, {"json": [1]}),
            ("POST", "/api/v1/deployments", 422, {"json": {"group": "lab"}}),
            ("POST", "/api/v1/deployments", 404, {"json": {"release_id": 99, "group": "lab"}}),
            ("GET", "/api/v1/deployments?state=bogus", 400, {}),
            ("GET", "/api/v1/deployments/nope", 404, {}),
            ("POST", "/api/v1/deployments/nope/pause", 404, {}),
            ("GET", "/api/v1/releases/abc", 400, {}),
            ("GET", "/api/v1/devices?offset=-1", 400, {}),
            ("GET", "/api/v1/devices/dev-000/history?kind=x", 400, {}),
        ]
        for method, path, status, kwargs in refused:
            body = await admin.call(method, path, expect=status, **kwargs)
            assert body["error"], (path, body)
        release = await admin.call("POST", "/api/v1/releases", expect=201, data=envelope)
        for body in (
            {"stages_pct": [50, 20, 100]},
            {"stages_pct": [50]},
            {"stages_pct": "5,25"},
            {"abort_threshold_pct": 0},
            {"stage_timeout_s": 10**9},
            {"devices": ["dev-000", "ghost"]},
            {"devices": "dev-000"},
            {"group": "nobody-here"},
        ):
            request = {"release_id": release["id"], "group": "lab", **body}
            answer = await admin.call("POST", "/api/v1/deployments", expect=422, json=request)
            assert answer["error"]
        for field, value in (  # issue 23 item 10: each was a 500 or silently truncated
            ("stages_pct[0]", "10" * 200),
            ("stages_pct[0]", "true"),
            ("abort_threshold_pct", "1e400"),
            ("min_executed", "1e400"),
            ("min_executed", "2.7"),
            ("min_executed", "1" + "0" * 30),
        ):
            key = field.partition("[")[0]
            shown = f"[{value}, 100]" if key != field else value
            raw = f'{{"release_id": {release["id"]}, "group": "lab", "{key}": {shown}}}'
            answer = await admin.call(
                "POST",
                "/api/v1/deployments",
                expect=422,
                data=raw.encode(),
                headers={"Content-Type": "application/json"},
            )
            assert answer["error"].startswith(f"{field}: "), answer
        assert (await admin.call("GET", "/api/v1/deployments"))["deployments"] == []
        envelope_back = await admin.call("GET", f"/api/v1/releases/{release['id']}/envelope")
        assert envelope_back == json.loads(envelope)  # byte for byte what was uploaded


async def test_a_short_max_wait_caps_the_default_stage_timeout(
    broker: Broker, tmp_path: Path
) -> None:
    """Issue 23: ``--max-wait`` below the 600 s default stage time-out refused (422) every
    deployment that did not set ``stage_timeout_s``; now the default is capped by it."""
    settings = broker.settings()
    async with fleet(settings, 1), hub_server(sqlite_url(tmp_path), settings, max_wait_s=60) as url:
        api = Api(url)
        await api.synced()
        created = await api.deploy("2.0.0")
        assert created["stage_timeout_s"] == 60
        done = await api.until(created["id"], "succeeded", "aborted")
        assert done["state"] == "succeeded"


def test_a_public_listener_needs_a_token_file() -> None:
    with pytest.raises(ValueError, match="needs --token-file"):
        ServerSettings(host="0.0.0.0").validate()
    ServerSettings(host="::1").validate()


def test_openapi_document_is_valid_and_names_every_route() -> None:
    from edgeagent.hub.server.api import openapi_document

    document = openapi_document()
    validate(document)
    app = create_app(HubContext(None, ServerSettings(), None, None, None), Tokens({}, open=True))
    routes = set()
    for route in app.router.routes():
        path = route.resource.canonical.replace("{action:pause|resume|abort}", "{action}")
        if path.startswith("/api/") or path == "/openapi.json":  # the rest are HTML pages
            routes.add((route.method.lower(), path))
    documented = {(m, p) for p, item in document["paths"].items() for m in item}
    assert routes - {("head", p) for _, p in routes} == documented


async def _cli(*args: str) -> tuple[int, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "edgeagent.cli",
        "hub",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await process.communicate()
    return process.returncode or 0, out.decode()


async def test_hub_status_and_rollout_as_clients_of_the_server(
    broker: Broker, tmp_path: Path
) -> None:
    settings = broker.settings()
    tokens = write_tokens(tmp_path / "tokens", admin=ADMIN)
    (tmp_path / "token").write_text(ADMIN)
    release = tmp_path / "mobilenet_v2-2.0.0.release.json"
    release.write_bytes(make_release("2.0.0"))
    async with (
        fleet(settings, 3) as devices,
        hub_server(sqlite_url(tmp_path), settings, token_file=tokens) as url,
    ):
        await Api(url, ADMIN).synced()
        server = ("--server", url, "--token-file", str(tmp_path / "token"))
        code, out = await _cli("status", *server, "--json")
        assert code == 0, out
        assert [row["device_id"] for row in json.loads(out)] == ["dev-000", "dev-001", "dev-002"]
        code, out = await _cli("status", "--server", url)
        assert code == 2 and "401" in out  # no token: refused (an input error), and said so
        code, out = await _cli(
            "rollout", str(release), "--group", "lab", "--stages", "50,100", *server
        )
        assert code == 0, out
        assert "succeeded" in out.splitlines()[-1]
        assert all(d.version == "2.0.0" for d in devices)


async def test_dashboard_pages_with_sign_in(broker: Broker, tmp_path: Path) -> None:
    settings = broker.settings()
    tokens = write_tokens(tmp_path / "tokens", read=READ, admin=ADMIN)
    async with (
        fleet(settings, 3) as devices,
        hub_server(sqlite_url(tmp_path), settings, token_file=tokens) as url,
    ):
        hot = devices[1]
        hot.reporter.sources["governor"] = lambda: {
            "state": "hot",
            "temperatures": [{"sensor": "cpu-thermal", "celsius": 83.0}],
        }
        await hot.report()
        api = Api(url, ADMIN)
        await api.synced()
        found = await api.call("GET", "/api/v1/devices/dev-001")
        while found["governor_state"] != "hot":
            found = await api.call(
                "GET", f"/api/v1/devices/dev-001?wait=30&after={found['version']}"
            )
        created = await api.deploy("2.0.0", stages_pct=[100])
        await api.until(created["id"], "succeeded")

        # a browser keeps cookies for 127.0.0.1 too (aiohttp only when told it is safe)
        async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as browser:
            async with browser.get(f"{url}/", allow_redirects=False) as response:
                assert (response.status, response.headers["Location"]) == (303, "/login")
            async with browser.post(f"{url}/login", data={"token": READ}) as response:
                assert response.status == 200  # followed to the fleet page
                page = await response.text()
            assert "3 devices" in page and page.count("/ui/devices/dev-") == 3
            async with browser.get(f"{url}/?governor_state=hot") as response:
                page = await response.text()
            assert "1 devices" in page and "dev-001" in page and "dev-002" not in page
            async with browser.get(f"{url}/ui/devices/dev-001") as response:
                page = await response.text()
            assert "<svg id='temperature'" in page and "83.0 °C" in page
            assert "onnxruntime" in page and "succeeded" in page, page
            async with browser.get(f"{url}/ui/deployments/{created['id']}") as response:
                page = await response.text()
            assert "State <b>succeeded</b>" in page and page.count("installed") == 3
            async with browser.get(f"{url}/ui/devices/<script>") as response:
                assert response.status == 404
                assert "<script>" not in await response.text()


async def test_a_deployment_pages_its_devices_and_counts_them_all(
    broker: Broker, tmp_path: Path
) -> None:
    """A long poll of a large deployment must not carry every device row on every change."""
    settings = broker.settings()
    async with (
        fleet(settings, 5),
        hub_server(sqlite_url(tmp_path), settings, page_size=2) as url,
    ):
        api = Api(url)
        await api.synced()
        created = await api.deploy("2.0.0", stages_pct=[40, 100])
        assert (created["device_count"], len(created["devices"])) == (5, 2)
        done = await api.until(created["id"], "succeeded", "aborted")
        assert [s["devices"] for s in done["stages"]] == [2, 3]
        assert done["totals"]["succeeded"] == 5

        second = await api.call("GET", f"/api/v1/deployments/{created['id']}?limit=2&offset=2")
        assert [d["device_id"] for d in second["devices"]] == ["dev-002", "dev-003"]
        assert second["totals"] == done["totals"] and second["stages"] == done["stages"]
        whole = await api.all_devices(done, page=2)
        assert [d["device_id"] for d in whole["devices"]] == [f"dev-00{i}" for i in range(5)]
        await api.call("GET", f"/api/v1/deployments/{created['id']}?limit=0", expect=400)

        async with aiohttp.ClientSession() as browser:
            page_url = f"{url}/ui/deployments/{created['id']}?offset=2"
            async with browser.get(page_url) as response:
                page = await response.text()
        assert "devices 3–4 of 5" in page and page.count("/ui/devices/dev-") == 2
        assert f"/ui/deployments/{created['id']}?offset=4" in page  # the next page's link
