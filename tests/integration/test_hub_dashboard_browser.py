"""The dashboard in a real headless Chromium (the Debian package, driven by Selenium): the
fleet table and its filters, a device page, a deployment page that follows a rollout live, by
itself, and on across a hub restart, and the actions (create, retry, roll back). The
screenshots go to the test's temporary directory, never into the tree: the docs' pictures are
made again only on request (``scripts/docs-screenshots.sh`` sets ``EDGEAGENT_SCREENSHOTS_DIR``).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from aiohttp import web

from devtools.broker import Broker
from devtools.hub_fleet import (
    MODEL,
    Api,
    FakeDevice,
    HubProcess,
    fleet,
    hub_server,
    make_release,
    write_tokens,
)
from edgeagent.hub.server import ingest as ingest_module
from edgeagent.updates import report as report_module

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.timeout(180)]

SCREENSHOTS_ENV = "EDGEAGENT_SCREENSHOTS_DIR"  # where to keep the pictures, on request only
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
WAIT_S = 60  # the longest any page may take to show what is awaited (a bound, not a measure)
REBOUND = "rebind.example"  # an attacker's name that resolves to 127.0.0.1


@pytest.fixture(name="browser")
def browser_fixture() -> Iterator:
    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed")
    if CHROMIUM is None or DRIVER is None:
        pytest.skip("Chromium is not installed (apt-get install chromium chromium-driver)")
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1280,900",
        f"--host-resolver-rules=MAP {REBOUND} 127.0.0.1",  # DNS rebinding, already rebound
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def _text_of(driver, css: str) -> str:
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException

    try:
        return driver.find_element("css selector", css).text
    except (NoSuchElementException, StaleElementReferenceException):
        return ""


def _await_text(driver, css: str, wanted: str) -> str:
    """Let the page change by itself until ``css`` shows ``wanted`` (WebDriverWait polls)."""
    from selenium.webdriver.support.ui import WebDriverWait

    WebDriverWait(driver, WAIT_S).until(lambda d: wanted in _text_of(d, css))
    return _text_of(driver, css)


def screenshot_dir(tmp_path: Path) -> Path:
    """The docs' picture folder when the caller asks for it by name, else a throw-away one."""
    wanted = os.environ.get(SCREENSHOTS_ENV)
    directory = Path(wanted) if wanted else tmp_path / "screenshots"
    directory.mkdir(parents=True, exist_ok=True)
    return directory


async def test_dashboard_in_chromium(broker: Broker, tmp_path: Path, browser, monkeypatch) -> None:
    pictures = screenshot_dir(tmp_path)
    settings = broker.settings()
    hold = asyncio.Event()
    async with (
        fleet(settings, 4, group="lab", hold=hold) as lab,
        fleet(settings, 2, group="edge", name="cam"),
        hub_server(f"sqlite:///{tmp_path / 'hub.db'}", settings) as url,
    ):
        api = Api(url)
        await api.synced()
        hot = lab[1]
        hot.reporter.sources["governor"] = lambda: {
            "state": "hot",
            "temperatures": [{"sensor": "cpu-thermal", "celsius": 81.0}],
        }
        await hot.report()

        def fleet_table() -> None:
            browser.get(f"{url}/")
            assert "6 devices" in _text_of(browser, "#counts")
            browser.find_element("name", "group").send_keys("edge")
            browser.find_element("css selector", "form.filters button").click()
            _await_text(browser, "#counts", "2 devices")
            rows = browser.find_elements("css selector", "#fleet tbody tr")
            assert [r.text.split()[0] for r in rows] == ["cam-000", "cam-001"]
            browser.get(f"{url}/")
            browser.save_screenshot(str(pictures / "hub-fleet.png"))

        await asyncio.to_thread(fleet_table)

        created = await api.deploy("2.0.0", stages_pct=[50, 100])
        await asyncio.gather(*(d.got_release.wait() for d in lab[:2]))

        def deployment_waiting() -> None:
            browser.get(f"{url}/ui/deployments/{created['id']}")
            assert "running" in _text_of(browser, "#state")
            assert "Pause" in browser.page_source  # admin buttons while it is active

        await asyncio.to_thread(deployment_waiting)
        hold.set()  # the devices answer; the open page must follow on its own

        def deployment_done() -> None:
            _await_text(browser, "#state", "succeeded")
            statuses = [r.text for r in browser.find_elements("css selector", "#outcomes tbody tr")]
            assert len(statuses) == 4 and all("succeeded" in s for s in statuses)
            browser.save_screenshot(str(pictures / "hub-deployment.png"))

        await asyncio.to_thread(deployment_done)
        await serve_for_a_while(api, hot, monkeypatch)

        def device_page() -> None:
            browser.get(f"{url}/ui/devices/dev-001")
            for chart in ("#temperature", "#throughput", "#errors", "#latency"):
                assert browser.find_element("css selector", chart).is_displayed(), chart
            lines = browser.find_elements("css selector", "#latency polyline")
            assert len(lines) == 4  # p50 and p95 of each model
            models = browser.find_element("id", "models").text
            assert f"{MODEL} 2.0.0" in models and "12.5 /s" in models, models
            assert "81.0" in browser.page_source
            browser.set_window_size(1280, 1180)  # the picture shows every chart
            browser.save_screenshot(str(pictures / "hub-device.png"))

        await asyncio.to_thread(device_page)


# what the hot device serves each minute: requests/s, % failed, p95 ms of each of its models
MINUTES = [
    ((8.0, 0.0, 22.0), (2.0, 0.0, 118.0), 70.5),
    ((9.5, 0.5, 24.0), (2.5, 0.0, 121.0), 72.0),
    ((12.0, 0.0, 31.0), (3.0, 0.0, 135.0), 75.5),
    ((14.0, 2.5, 38.0), (3.5, 5.0, 160.0), 79.0),
    ((11.0, 1.0, 29.0), (2.5, 0.0, 128.0), 80.5),
    ((9.0, 0.0, 23.0), (2.0, 0.0, 119.0), 78.0),
    ((10.0, 0.5, 24.0), (2.5, 0.0, 122.0), 76.5),
    ((12.5, 0.0, 27.0), (3.0, 0.0, 125.0), 81.0),
]


async def serve_for_a_while(api: Api, device: FakeDevice, monkeypatch) -> None:
    """The device reports a minute of traffic at a time, each report stored before the next is
    sent, so each is a sample of its own. A minute passes between two on a clock the device's
    reporter and the hub's ingest share (the charts look as they would after nine minutes)."""
    clock = {"now": time.time()}
    fake = SimpleNamespace(time=lambda: clock["now"], monotonic=time.monotonic)
    monkeypatch.setattr(report_module, "time", fake)
    monkeypatch.setattr(ingest_module, "time", fake)
    counters = {MODEL: [1000, 3], "coco_ssd": [200, 0]}
    figures: dict[str, tuple[float, float, float]] = {}
    temperature = {"celsius": 69.0}

    def models() -> dict:
        return {
            name: {
                "state": "READY",
                "active_version": version,
                "versions": {
                    version: {
                        "runtime": "onnxruntime",
                        "device": "CPUExecutionProvider",
                        "precision": "int8",
                        "traffic": {
                            "requests": counters[name][0],
                            "errors": counters[name][1],
                            "p50_ms": round(figures.get(name, (0, 0, 30))[2] / 2.5, 1),
                            "p95_ms": figures.get(name, (0, 0, 30))[2],
                        },
                    }
                },
            }
            for name, version in ((MODEL, device.version), ("coco_ssd", "1.1.0"))
        }

    device.reporter.sources["models"] = models
    device.reporter.sources["governor"] = lambda: {
        "state": "hot" if temperature["celsius"] > 80 else "warm",
        "temperatures": [{"sensor": "cpu-thermal", "celsius": temperature["celsius"]}],
    }
    for step in [None, *MINUTES]:
        if step is not None:
            clock["now"] += 60
            for name, (rate, failed_pct, p95) in zip(counters, step[:2], strict=True):
                served = round(rate * 60)
                counters[name][0] += served
                counters[name][1] += round(served * failed_pct / 100)
                figures[name] = (rate, failed_pct, p95)
            temperature["celsius"] = step[2]
        await device.report()
        await api.long_poll(
            f"/api/v1/devices/{device.topics.device_id}",
            lambda found: found["reported_at"] == clock["now"],
        )


# A page on another port of 127.0.0.1 (the same site as the hub, so the SameSite=Strict cookie
# travels) trying what a browser lets any page do without a CORS preflight: bodiless, text/plain
# and Blob POSTs with the cookie, and a form post into a hidden frame (issue 23 finding 2).
ATTACK = """<!doctype html><html><body>
<iframe name='sink'></iframe>
<form id='f' method='post' target='sink' action='{hub}/api/v1/deployments/{id}/abort'>
<input name='reason' value='forged'></form>
<script>
const hub = '{hub}', abort = `${{hub}}/api/v1/deployments/{id}/abort`;
const send = (url, extra) => fetch(url, {{method: 'POST', mode: 'no-cors',
                                         credentials: 'include', ...extra}}).catch(() => null);
(async () => {{
  await send(abort, {{}});
  await send(abort, {{body: new Blob(['{{}}'])}});
  await send(`${{hub}}/api/v1/deployments`, {{headers: {{'Content-Type': 'text/plain'}},
    body: JSON.stringify({{model: '{model}', version: '2.0.0', group: 'edge'}})}});
  document.querySelector('iframe').addEventListener('load', () => {{ document.title = 'done'; }});
  document.getElementById('f').submit();
}})();
</script></body></html>"""


async def test_a_page_on_another_port_cannot_drive_the_hub(
    broker: Broker, tmp_path: Path, browser
) -> None:
    admin = "a" * 24
    tokens = write_tokens(tmp_path / "tokens", admin=admin)
    settings = broker.settings()
    hold = asyncio.Event()
    attacker = web.Application()
    async with (
        fleet(settings, 2, group="lab", hold=hold),
        fleet(settings, 1, group="edge", name="cam"),
        hub_server(f"sqlite:///{tmp_path / 'hub.db'}", settings, token_file=tokens) as url,
    ):
        api = Api(url, admin)
        await api.synced()
        created = await api.deploy("2.0.0", stages_pct=[50, 100])
        page = ATTACK.format(hub=url, id=created["id"], model=MODEL)

        async def attack_page(request: web.Request) -> web.Response:
            return web.Response(text=page, content_type="text/html")

        attacker.add_routes([web.get("/", attack_page)])
        runner = web.AppRunner(attacker)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        evil = f"http://127.0.0.1:{runner.addresses[0][1]}/"

        def sign_in_then_visit_the_attacker() -> str:
            browser.get(f"{url}/login")  # the real sign-in form: Origin null, same-origin
            browser.find_element("name", "token").send_keys(admin)
            browser.find_element("css selector", "form button").click()
            _await_text(browser, "#counts", "3 devices")
            browser.get(evil)
            from selenium.webdriver.support.ui import WebDriverWait

            WebDriverWait(browser, WAIT_S).until(lambda d: d.title == "done")
            rebound = url.replace("127.0.0.1", REBOUND)
            browser.get(f"{rebound}/api/v1/deployments")
            return browser.page_source

        rebound_page = await asyncio.to_thread(sign_in_then_visit_the_attacker)
        assert "not a name of this listener" in rebound_page
        found = await api.call("GET", f"/api/v1/deployments/{created['id']}")
        assert found["state"] == "running", found["reason"]
        assert len((await api.call("GET", "/api/v1/deployments"))["deployments"]) == 1

        def abort_from_the_dashboard() -> None:  # control: the page's own button still works
            browser.get(f"{url}/ui/deployments/{created['id']}")
            browser.find_element("css selector", "button[data-action='abort']").click()
            _await_text(browser, "#state", "aborted")

        await asyncio.to_thread(abort_from_the_dashboard)
        hold.set()
        await runner.cleanup()


async def test_a_deployment_page_follows_on_across_a_hub_restart(
    broker: Broker, tmp_path: Path, browser
) -> None:
    """The page is open while the hub is killed and started again on the same port and
    database; the devices answer only then, and the page must show the end by itself (it never
    updated again after a restart, 3 of 3 runs: its poll loop ended on the network error)."""
    settings = broker.settings()
    database = f"sqlite:///{tmp_path / 'hub.db'}"
    hold = asyncio.Event()
    async with fleet(settings, 2, group="lab", hold=hold) as lab:
        first = HubProcess(database, settings)
        url = await first.start()
        second = HubProcess(database, settings, "--port", url.rsplit(":", 1)[1])
        try:
            api = Api(url)
            await api.synced()
            created = await api.deploy("2.0.0", stages_pct=[100])
            await asyncio.gather(*(d.got_release.wait() for d in lab))
            path = f"/api/v1/deployments/{created['id']}"
            await api.long_poll(path, lambda found: found["totals"]["sent"] == 2)

            def page_open() -> None:
                browser.get(f"{url}/ui/deployments/{created['id']}")
                assert "running" in _text_of(browser, "#state")

            await asyncio.to_thread(page_open)
            assert first.stop(signal.SIGKILL) == -signal.SIGKILL
            assert await second.start() == url
            await api.synced()
            hold.set()  # the change comes after the restart

            def page_done() -> None:
                _await_text(browser, "#state", "succeeded")
                rows = browser.find_elements("css selector", "#outcomes tbody tr")
                assert len(rows) == 2 and all("succeeded" in r.text for r in rows)

            await asyncio.to_thread(page_done)
        finally:
            for hub in (first, second):
                if hub.process is not None and hub.process.poll() is None:
                    hub.stop(signal.SIGTERM)


def _fill(driver, values: dict[str, str]) -> None:
    from selenium.webdriver.support.ui import Select

    for name, value in values.items():
        element = driver.find_element("id", f"new-{name}")
        if element.tag_name == "select":
            Select(element).select_by_visible_text(value)
        else:
            element.clear()
            element.send_keys(value)


def _deployment_id(driver, leaving: str = "") -> str:
    """The id of the deployment page the browser went to (from ``leaving``'s page)."""
    from selenium.webdriver.support.ui import WebDriverWait

    def there(d) -> bool:
        return "/ui/deployments/dep-" in d.current_url and not (
            leaving and f"/{leaving}" in d.current_url
        )

    WebDriverWait(driver, WAIT_S).until(there)
    return driver.current_url.rsplit("/", 1)[1].split("?")[0]


async def test_create_retry_and_roll_back_from_the_dashboard(
    broker: Broker, tmp_path: Path, browser
) -> None:
    """Signed in with an admin token, so each action needs the page's CSRF token: create a
    deployment from the form (a refusal shows the API's error), watch it end with one failure,
    filter the failures, retry them (a new deployment of the same release to that device
    only), and roll the retry back (the button calls the API and opens what it answered).
    Signed in again with a read token, the pages show none of these, and the server refuses
    the rollback the page's script would send."""
    admin, reader = "a" * 24, "r" * 24
    tokens = write_tokens(tmp_path / "tokens", admin=admin, read=reader)
    settings = broker.settings()
    async with (
        fleet(settings, 3, group="lab", failing=1) as lab,
        hub_server(f"sqlite:///{tmp_path / 'hub.db'}", settings, token_file=tokens) as url,
    ):
        api = Api(url, admin)
        await api.synced()
        for version in ("1.5.0", "2.0.0"):
            await api.call("POST", "/api/v1/releases", expect=201, data=make_release(version))

        refusal = await api.call(
            "POST", "/api/v1/deployments", expect=422, json={"release_id": 2, "stages_pct": [100]}
        )

        def create() -> str:
            browser.get(f"{url}/login")
            browser.find_element("name", "token").send_keys(admin)
            browser.find_element("css selector", "form button").click()
            _await_text(browser, "#counts", "3 devices")
            browser.get(f"{url}/ui/deployments")
            _fill(browser, {"release": f"{MODEL} 2.0.0 (release 2)", "stages": "100"})
            browser.find_element("id", "create").click()  # no group, no devices: refused
            assert _await_text(browser, "#message", refusal["error"]) == refusal["error"]
            assert browser.find_element("id", "message").get_attribute("class") == "bad"
            # the abort rule waits for all 3 answers: the failing device may well answer first
            _fill(browser, {"group": "lab", "threshold": "50", "min": "3"})
            browser.find_element("id", "create").click()
            return _deployment_id(browser)

        first = await asyncio.to_thread(create)
        done = await api.until(first, "succeeded", "aborted")
        assert done["state"] == "succeeded" and done["totals"]["failed"] == 1, done
        assert done["abort_threshold_pct"] == 50 and done["stages_pct"] == [100]
        assert done["min_executed"] == 3

        def failures_then_retry() -> str:
            _await_text(browser, "#state", "succeeded")  # the page followed on its own
            assert "abort when at least 50 %" in _text_of(browser, "#policy")
            stage = browser.find_element("css selector", "#stages tbody tr").text
            assert stage.count(":") == 4, stage  # started and ended, hh:mm:ss each
            rows = browser.find_elements("css selector", "#outcomes tbody tr")
            assert all(r.text.count(":") == 4 for r in rows)  # sent and answered times
            browser.find_element("id", "show-failures").click()
            _await_text(browser, "#shown", "failed or timed out")
            rows = browser.find_elements("css selector", "#outcomes tbody tr")
            assert [r.text.split()[0] for r in rows] == ["dev-000"]
            browser.find_element("id", "retry").click()
            return _deployment_id(browser, leaving=first)

        retry = await asyncio.to_thread(failures_then_retry)
        assert retry != first
        again = await api.until(retry, "succeeded", "aborted")
        assert [d["device_id"] for d in again["devices"]] == ["dev-000"]
        assert again["release_id"] == done["release_id"] and again["stages_pct"] == [100]
        assert [len(d.received) for d in lab] == [2, 1, 1]

        def roll_back(refused: str = "") -> str:
            from selenium.webdriver.support.ui import Select

            browser.get(f"{url}/ui/deployments/{retry}")

            Select(browser.find_element("id", "rollback-version")).select_by_visible_text("1.5.0")
            browser.find_element("id", "rollback").click()
            if refused:  # the API's refusal, shown on the page; the deployment stays as it was
                return _await_text(browser, "#message", refused)
            _deployment_id(browser, leaving=retry)
            return _text_of(browser, "#rollback-of")

        # Without --release-key the server cannot re-sign 1.5.0 above the serials it sent...
        assert "needs --release-key" in await asyncio.to_thread(roll_back, "needs --release-key")
        assert (await api.call("GET", f"/api/v1/deployments/{retry}"))["state"] == "succeeded"
        # ...until 1.5.0 is uploaded signed again with a serial above them (hub sign)
        resigned = make_release("1.5.0", serial=9_000_000)
        await api.call("POST", "/api/v1/releases", expect=201, data=resigned)
        assert retry in await asyncio.to_thread(roll_back)
        assert (await api.call("GET", f"/api/v1/deployments/{retry}"))["state"] == "rolled_back"

        def read_only() -> int:
            """Signed in with the read token: no button on a page where an admin has Roll back
            and Retry; the same request from the page's own script is refused all the same."""
            browser.delete_all_cookies()
            browser.get(f"{url}/login")
            browser.find_element("name", "token").send_keys(reader)
            browser.find_element("css selector", "form button").click()
            _await_text(browser, "#counts", "3 devices")
            browser.get(f"{url}/ui/deployments/{first}")
            assert "admin token" in _text_of(browser, "#read-only")
            assert not browser.find_elements("css selector", "#actions button, #rollback, #retry")
            browser.get(f"{url}/ui/deployments")
            assert not browser.find_elements("id", "create")
            browser.get(f"{url}/ui/deployments/{first}")
            return browser.execute_async_script(ROLL_BACK_FROM_THE_PAGE, "1.5.0")

        assert await asyncio.to_thread(read_only) == 403
        assert (await api.call("GET", f"/api/v1/deployments/{first}"))["state"] == "succeeded"


# what the Roll back button's handler sends, from the page itself with its CSRF token
ROLL_BACK_FROM_THE_PAGE = """
const [version, done] = arguments;
fetch(`/api/v1/deployments/${encodeURIComponent(page.id)}/rollback`, {
  method: 'POST', body: JSON.stringify({version}),
  headers: {'X-CSRF-Token': page.csrf, 'Content-Type': 'application/json'},
}).then((r) => done(r.status), () => done(-1));
"""
