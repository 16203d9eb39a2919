"""The dashboard in a real headless Chromium (the Debian package, driven by Selenium): the
fleet table and its filters, a device page, and a deployment page that follows a rollout live,
by itself. The screenshots go to the test's temporary directory, never into the tree: the docs'
pictures are made again only on request (``scripts/docs-screenshots.sh`` sets
``EDGEAGENT_SCREENSHOTS_DIR``)."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools.broker import Broker
from devtools.hub_fleet import Api, fleet, hub_server

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.timeout(180)]

SCREENSHOTS_ENV = "EDGEAGENT_SCREENSHOTS_DIR"  # where to keep the pictures, on request only
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
WAIT_S = 60  # the longest any page may take to show what is awaited (a bound, not a measure)


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


async def test_dashboard_in_chromium(broker: Broker, tmp_path: Path, browser) -> None:
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
            browser.get(f"{url}/ui/devices/dev-001")
            assert browser.find_element("css selector", "#temperature").is_displayed()
            assert "81.0" in browser.page_source
            browser.save_screenshot(str(pictures / "hub-device.png"))

        await asyncio.to_thread(deployment_done)
