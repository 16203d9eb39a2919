"""The samples review page in a real headless Chromium: sign in, see the images (the page's
CSP lets this host's images in), correct one sample's class and accept another's, and find the
verdicts in the hub's database."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from devtools.sample_hub import SampleHub, capture_samples
from tests.integration.test_capture_hub import ADMIN, _device, hub  # noqa: F401
from tests.integration.test_hub_dashboard_browser import (  # noqa: F401
    WAIT_S,
    _await_text,
    browser_fixture,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


async def test_review_in_chromium(tmp_path: Path, hub: SampleHub, browser) -> None:  # noqa: F811
    spool, _, uploader = _device(tmp_path, "dev-a", hub.url)
    capture_samples(spool, "dev-a", "digits", "classification", "3", 2)
    assert await uploader.run_once() == 2
    first, second = sorted(row["id"] for row in await hub.rows())

    def review() -> list[int]:
        from selenium.webdriver.support.ui import WebDriverWait

        browser.get(f"{hub.url}/login")
        browser.find_element("name", "token").send_keys(ADMIN)
        browser.find_element("css selector", "form button").click()
        # the sign-in's answer sets the cookie: wait for it to land before the next page
        WebDriverWait(browser, WAIT_S).until(lambda d: "/login" not in d.current_url)
        browser.get(f"{hub.url}/ui/samples")
        assert "digits" in browser.find_element("id", "samples").text
        browser.get(f"{hub.url}/ui/samples/digits/1.0.0")
        widths = [
            browser.execute_script("return arguments[0].naturalWidth", image)
            for image in browser.find_elements("css selector", "figure img")
        ]
        card = browser.find_element("css selector", f"figure[data-sample='{first}']")
        field = card.find_element("css selector", ".correction")
        field.clear()
        field.send_keys("8")
        card.find_element("css selector", "button[data-verdict='corrected']").click()
        _await_text(browser, f"figure[data-sample='{first}'] .status", "corrected")
        other = browser.find_element("css selector", f"figure[data-sample='{second}']")
        other.find_element("css selector", "button[data-verdict='accepted']").click()
        _await_text(browser, f"figure[data-sample='{second}'] .status", "accepted")
        return widths

    widths = await asyncio.to_thread(review)
    assert widths == [32, 32]  # both images loaded under the page's policy
    rows = {row["id"]: row for row in await hub.rows()}
    assert (rows[first]["status"], rows[first]["annotation"]) == ("corrected", {"label": "8"})
    assert (rows[second]["status"], rows[second]["annotation"]) == ("accepted", {"label": "3"})
    async with aiohttp.ClientSession() as http:  # a page without the CSRF token changes nothing
        cookies = {"edgeagent_hub_token": ADMIN}
        async with http.post(
            f"{hub.url}/ui/samples/{first}/review", json={"status": "rejected"}, cookies=cookies
        ) as answer:
            assert answer.status == 403
    assert {row["id"]: row["status"] for row in await hub.rows()}[first] == "corrected"
