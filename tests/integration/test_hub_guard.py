"""The hub server behind the shared listener guard, over real HTTP (issue 23 findings 2, 5, 9).

- 2: cross-site requests and DNS rebinding drove the hub: a foreign ``Origin``, a page on
  another port of 127.0.0.1 riding the SameSite cookie, ``text/plain`` bodies and
  ``Host: rebind.example`` were all answered. Each is refused now, with the deployment unchanged,
  after a control that the same request from the hub's own page goes through.
- 5: without ``--token-file`` the hub on loopback was open. It now makes an admin token (0600,
  in its state directory) and says where; ``--open`` is the operator's explicit choice.
- 9: answers had no Content-Security-Policy, X-Frame-Options or nosniff.
"""

from __future__ import annotations

import asyncio
import re
import signal
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from devtools.broker import Broker
from devtools.hub_fleet import MODEL, Api, HubProcess, fleet, hub_server, make_release, write_tokens
from edgeagent.httpguard import SECURITY_HEADERS
from edgeagent.hub.server.auth import ADMIN_TOKEN_FILE, CSRF_HEADER
from edgeagent.hub.server.settings import ServerSettings

pytestmark = [pytest.mark.broker, pytest.mark.timeout(120)]

READ, ADMIN = "r" * 24, "a" * 24


@asynccontextmanager
async def _held_deployment(
    broker: Broker, tmp_path: Path, **overrides: Any
) -> AsyncIterator[tuple[str, Api, dict[str, Any]]]:
    """A hub (tokens unless told otherwise) with a deployment in stage 1, its devices held."""
    settings = broker.settings()
    hold = asyncio.Event()
    if "open" not in overrides:
        overrides["token_file"] = write_tokens(tmp_path / "tokens", read=READ, admin=ADMIN)
    async with (
        fleet(settings, 2, hold=hold) as devices,
        hub_server(f"sqlite:///{tmp_path / 'hub.db'}", settings, **overrides) as url,
    ):
        api = Api(url, "" if overrides.get("open") else ADMIN)
        await api.synced()
        created = await api.deploy("2.0.0", stages_pct=[50, 100])
        await devices[0].got_release.wait()
        try:
            yield url, api, created
        finally:
            hold.set()


async def _state(api: Api, deployment: dict[str, Any]) -> str:
    return (await api.call("GET", f"/api/v1/deployments/{deployment['id']}"))["state"]


async def _signed_in(url: str) -> aiohttp.ClientSession:
    """A browser-like session: the dashboard's cookies after signing in with the admin token."""
    session = aiohttp.ClientSession(url, cookie_jar=aiohttp.CookieJar(unsafe=True))
    async with session.post("/login", data={"token": ADMIN}, allow_redirects=False) as response:
        assert response.status == 303
    return session


async def _page_csrf(session: aiohttp.ClientSession, deployment: dict[str, Any]) -> str:
    async with session.get(f"/ui/deployments/{deployment['id']}") as response:
        page = await response.text()
    found = re.search(r'"csrf": ?"([0-9a-f]{64})"', page)  # the page script's data
    assert found, page
    return found.group(1)


async def test_a_cookie_cannot_abort_from_another_port_or_without_the_pages_token(
    broker: Broker, tmp_path: Path
) -> None:
    async with _held_deployment(broker, tmp_path) as (url, api, created):
        abort = f"/api/v1/deployments/{created['id']}/abort"
        own, other = url, url.rsplit(":", 1)[0] + ":1"
        session = await _signed_in(url)
        async with session:
            csrf = await _page_csrf(session, created)
            for headers, status in (
                ({"Origin": other}, 403),  # another port of 127.0.0.1: same site, other origin
                ({"Sec-Fetch-Site": "same-site"}, 403),  # what Chromium says for that page
                ({"Origin": "https://evil.example"}, 403),
                ({"Origin": own}, 403),  # the cookie alone, without the page's CSRF token
                ({"Origin": own, CSRF_HEADER: "0" * 64}, 403),
                ({"Origin": own, "Content-Type": "text/plain", CSRF_HEADER: csrf}, 415),
            ):
                async with session.post(abort, headers=headers, data=b"") as response:
                    assert response.status == status, (headers, await response.text())
                assert await _state(api, created) == "running"
            async with session.post(abort, headers={"Origin": own, CSRF_HEADER: csrf}) as answer:
                assert answer.status == 200, await answer.text()  # control: the page's own button
        assert await _state(api, created) == "aborted"


async def test_another_sign_in_gets_another_csrf_token(broker: Broker, tmp_path: Path) -> None:
    async with _held_deployment(broker, tmp_path) as (url, api, created):
        first, second = await _signed_in(url), await _signed_in(url)
        async with first, second:
            stale = await _page_csrf(first, created)
            assert stale != await _page_csrf(second, created)
            abort = f"/api/v1/deployments/{created['id']}/abort"
            async with second.post(abort, headers={CSRF_HEADER: stale}) as response:
                assert response.status == 403
        assert await _state(api, created) == "running"


async def test_an_open_hub_refuses_text_plain_and_foreign_origins(
    broker: Broker, tmp_path: Path
) -> None:
    """Finding 2 as filed: a page on another origin aborted one deployment and created another
    with ``text/plain`` bodies; with ``--open`` only the guard stands in the way."""
    async with _held_deployment(broker, tmp_path, open=True) as (_url, api, created):
        body = f'{{"model": "{MODEL}", "version": "2.0.0", "group": "lab"}}'.encode()
        for path, headers, status in (
            (f"/api/v1/deployments/{created['id']}/abort", {"Origin": "http://127.0.0.1:1"}, 403),
            ("/api/v1/deployments", {"Content-Type": "text/plain"}, 415),
            ("/api/v1/deployments", {"Content-Type": "application/x-www-form-urlencoded"}, 415),
            ("/api/v1/releases", {"Content-Type": "text/plain", "Origin": "null"}, 403),
        ):
            await api.call("POST", path, expect=status, data=body, headers=headers)
        assert await _state(api, created) == "running"
        assert len((await api.call("GET", "/api/v1/deployments"))["deployments"]) == 1
        await api.call("POST", f"/api/v1/deployments/{created['id']}/abort")  # control: a script
        assert await _state(api, created) == "aborted"


@pytest.mark.parametrize("host", ["rebind.example", "rebind.example:8400", "127.0.0.1.nip.io"])
async def test_a_rebound_name_is_not_answered(broker: Broker, tmp_path: Path, host: str) -> None:
    async with _held_deployment(broker, tmp_path, open=True) as (_url, api, created):
        await api.call("GET", "/api/v1/deployments", headers={"Host": "127.0.0.1"})  # control
        answer = await api.call("GET", "/api/v1/devices", expect=403, headers={"Host": host})
        assert "--allowed-host" in answer["error"]
        abort = f"/api/v1/deployments/{created['id']}/abort"
        await api.call("POST", abort, expect=403, headers={"Host": host})
        assert await _state(api, created) == "running"


async def test_allowed_host_names_are_answered(broker: Broker, tmp_path: Path) -> None:
    settings = broker.settings()
    async with hub_server(
        f"sqlite:///{tmp_path / 'hub.db'}", settings, allowed_hosts=("hub.lan",)
    ) as url:
        await Api(url).call("GET", "/api/v1/health?wait=30", headers={"Host": "hub.lan:8400"})


async def test_every_answer_carries_the_security_headers(broker: Broker, tmp_path: Path) -> None:
    tokens = write_tokens(tmp_path / "tokens", admin=ADMIN)
    settings = broker.settings()
    async with (
        hub_server(f"sqlite:///{tmp_path / 'hub.db'}", settings, token_file=tokens) as url,
        aiohttp.ClientSession(url) as http,
    ):
        await Api(url, ADMIN).synced()  # (a hub stopped before it synced can hang its stop)
        auth = {"Authorization": f"Bearer {ADMIN}"}
        for path, headers, status in (
            ("/api/v1/health", auth, 200),
            ("/api/v1/health", {}, 401),
            ("/api/v1/nothing", auth, 404),
            ("/", {}, 303),
            ("/", auth, 200),
            ("/login", {}, 200),
            ("/api/v1/health", {"Host": "rebind.example"}, 403),
        ):
            async with http.get(path, headers=headers, allow_redirects=False) as response:
                assert response.status == status, path
                for name, value in SECURITY_HEADERS.items():
                    if name != "Content-Security-Policy":
                        assert response.headers[name] == value, (path, name)
                policy = response.headers["Content-Security-Policy"]
                assert "frame-ancestors 'none'" in policy and "default-src 'none'" in policy
                if response.content_type == "text/html":
                    nonce = re.search(r"'nonce-([^']+)'", policy)
                    assert nonce and f"nonce='{nonce.group(1)}'" in await response.text()


async def test_a_sign_in_with_an_unknown_token_sets_no_cookie(
    broker: Broker, tmp_path: Path
) -> None:
    tokens = write_tokens(tmp_path / "tokens", admin=ADMIN)
    settings = broker.settings()
    async with (
        hub_server(f"sqlite:///{tmp_path / 'hub.db'}", settings, token_file=tokens) as url,
        aiohttp.ClientSession(url, cookie_jar=aiohttp.CookieJar(unsafe=True)) as http,
    ):
        await Api(url, ADMIN).synced()
        urlencoded = {"Content-Type": "application/x-www-form-urlencoded"}
        for form in ({"token": "x" * 24}, {}, {"other": ADMIN}, b"token=%FF%ED%A0%80" * 8):
            async with http.post(
                "/login", data=form, allow_redirects=False, headers=urlencoded
            ) as response:
                assert response.status == 401 and "Unknown token" in await response.text()
            assert len(http.cookie_jar) == 0
        text_form = {"data": f"token={ADMIN}".encode(), "headers": {"Content-Type": "text/plain"}}
        async with http.post("/login", allow_redirects=False, **text_form) as response:
            assert response.status == 401  # a text/plain form carries no fields


# ---- finding 5: the hub on loopback needs a token -----------------------------------------


async def test_the_hub_on_loopback_makes_an_admin_token_and_needs_it(
    broker: Broker, tmp_path: Path
) -> None:
    settings = broker.settings()
    state = tmp_path / "state"
    db = f"sqlite:///{tmp_path / 'hub.db'}"
    token_file = state / ADMIN_TOKEN_FILE
    hub = HubProcess(db, settings, auth=("--state-dir", str(state)))
    url = await hub.start()
    try:
        assert str(token_file) in "".join(hub.output)  # it says where the token is
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        token = token_file.read_text().strip()
        anonymous, admin = Api(url), Api(url, token)
        await anonymous.call("POST", "/api/v1/releases", expect=401, data=make_release("2.0.0"))
        await anonymous.call("GET", "/api/v1/devices", expect=401)
        await admin.call("POST", "/api/v1/releases", expect=201, data=make_release("2.0.0"))
        await admin.synced()
    finally:
        assert hub.stop(signal.SIGTERM) == 0
    hub = HubProcess(db, settings, auth=("--state-dir", str(state)))
    url = await hub.start()  # a restart keeps the token it made
    try:
        await Api(url, token).synced()
    finally:
        hub.stop(signal.SIGTERM)


async def test_open_means_open_and_says_so(broker: Broker, tmp_path: Path) -> None:
    """The control for the test above: ``--open`` is what the old default did."""
    hub = HubProcess(f"sqlite:///{tmp_path / 'hub.db'}", broker.settings())
    url = await hub.start()
    try:
        await Api(url).call("POST", "/api/v1/releases", expect=201, data=make_release("2.0.0"))
        await Api(url).synced()
    finally:
        hub.stop(signal.SIGTERM)
    shown = subprocess.run(
        [sys.executable, "-m", "edgeagent.cli", "hub", "server", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "may upload, sign and deploy" in " ".join(shown.split())  # what --open means


def test_open_and_a_token_file_contradict(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="--open and --token-file"):
        ServerSettings(open=True, token_file=tmp_path / "tokens").validate()
    with pytest.raises(ValueError, match="needs --token-file"):
        ServerSettings(open=True, host="0.0.0.0").validate()


async def test_an_admin_token_others_can_read_is_refused(broker: Broker, tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / ADMIN_TOKEN_FILE).write_text("t" * 32)
    (state / ADMIN_TOKEN_FILE).chmod(0o644)
    hub = HubProcess(
        f"sqlite:///{tmp_path / 'hub.db'}", broker.settings(), auth=("--state-dir", str(state))
    )
    with pytest.raises(RuntimeError, match="chmod 600"):
        await hub.start()
