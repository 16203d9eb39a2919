"""A small client of the hub server's REST API, for ``hub status`` and ``hub rollout``.

With ``--server URL`` (or ``$EDGEAGENT_HUB_SERVER``) those commands read the fleet from the
server's database — complete, with a count, however large the fleet — and hand rollouts to the
server's durable controller instead of running them in the foreground, of model and agent
releases alike (``read_upload``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from edgeagent.hub.keys import HubError
from edgeagent.hub.publish import read_any_release
from edgeagent.hub.server.deploydb import FINAL

PAGE = 1000


def read_upload(path: Path, trust: Path | None = None) -> bytes:
    """The envelope of a release of either kind (``*.release.json``, ``*.agent-release.json``)
    to upload; with ``trust``, refused here unless devices trusting that file would take it
    (the server checks it again against its own ``--trust`` and serial floor)."""
    return read_any_release(path, trust)[0]


class HubApiClient:
    def __init__(self, url: str, token: str = "", *, timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> HubApiClient:
        self._session = aiohttp.ClientSession(headers=self.headers)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def call(self, method: str, path: str, *, wait_s: float = 0.0, **kwargs: Any) -> Any:
        assert self._session is not None, "use 'async with HubApiClient(...)'"
        timeout = aiohttp.ClientTimeout(total=self.timeout_s + wait_s)
        try:
            async with self._session.request(
                method, f"{self.url}/api/v1{path}", timeout=timeout, **kwargs
            ) as response:
                body = await response.json(content_type=None)
                if response.status >= 400:
                    error = body.get("error") if isinstance(body, dict) else body
                    raise HubError(f"hub server: {response.status} {error}")
                return body
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
            raise HubError(f"hub server {self.url}: {exc or exc.__class__.__name__}") from exc

    async def devices(self, group: str | None = None) -> tuple[list[dict[str, Any]], bool]:
        """Every device (all pages) and whether the server had read all retained state."""
        found: list[dict[str, Any]] = []
        synced = True
        while True:
            params: dict[str, Any] = {"limit": PAGE, "offset": len(found)}
            if group:
                params["group"] = group
            page = await self.call("GET", "/devices", params=params)
            found += page["devices"]
            synced = synced and page["synced"]
            if len(found) >= page["total"] or not page["devices"]:
                return found, synced

    async def deploy(
        self,
        envelope: bytes,
        *,
        group: str,
        devices: list[str],
        plan: dict[str, Any],
    ) -> dict[str, Any]:
        release = await self.call(
            "POST", "/releases", data=envelope, headers={"Content-Type": "application/json"}
        )
        body = {"release_id": release["id"], "group": group, "devices": devices, **plan}
        return await self.call("POST", "/deployments", json=body)

    async def follow(
        self,
        deployment: dict[str, Any],
        progress: Callable[[dict[str, Any]], None],
        *,
        poll_s: float = 30.0,
    ) -> dict[str, Any]:
        """Long-poll the deployment until it is final, calling ``progress`` on every change."""
        while deployment["state"] not in FINAL:
            progress(deployment)
            deployment = await self.call(
                "GET",
                f"/deployments/{deployment['id']}",
                params={"wait": poll_s, "after": deployment["version"]},
                wait_s=poll_s,
            )
        progress(deployment)
        return deployment


def status_row(device: dict[str, Any]) -> dict[str, Any]:
    """A server device as ``hub.status.format_table`` expects a row."""
    return {
        "device_id": device["device_id"],
        "group": device["group"],
        "online": device["online"],
        "availability": device["availability"],
        "models": device["models"],
        "update_state": device["update_state"],
        "last_result": device["last_result"],
        "last_code": device["last_code"],
        "last_release": "",
        "deployment_id": device["last_deployment"],
        "reported_at": device["reported_at"],
        "governor_state": device["governor_state"],
        "max_temp_c": device["max_temp_c"],
    }
