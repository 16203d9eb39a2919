"""A hub server's app in-process for the samples routes (no broker): for tests and benches.

The sample routes need only the database and the settings, so the app is served with no
ingest, MQTT link or controller; everything else about it is the server's own ``create_app``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from aiohttp import web

from edgeagent.hub.server.api import create_app
from edgeagent.hub.server.auth import Tokens
from edgeagent.hub.server.context import HubContext
from edgeagent.hub.server.database import open_engine, upgrade
from edgeagent.hub.server.samples_settings import SamplesSettings
from edgeagent.hub.server.schema import samples
from edgeagent.hub.server.settings import ServerSettings


@dataclass
class SampleHub:
    url: str
    state: Path
    engine: Any

    async def rows(self) -> list[dict]:
        async with self.engine.connect() as connection:
            return [dict(r._mapping) for r in await connection.execute(sa.select(samples))]

    def files(self) -> list[Path]:
        return sorted(p for p in (self.state / "samples").rglob("*") if p.is_file())


def write_device_tokens(path: Path, devices: dict[str, tuple[str, str]]) -> Path:
    """``device → (group, token)`` as the hub's --device-tokens file (mode 0600)."""
    path.write_text("".join(f"{d} {group} {token}\n" for d, (group, token) in devices.items()))
    path.chmod(0o600)
    return path


@contextlib.asynccontextmanager
async def sample_hub(
    state: Path, samples_settings: SamplesSettings, admin_token: str
) -> AsyncIterator[SampleHub]:
    settings = ServerSettings(
        database_url=f"sqlite:///{state / 'hub.db'}", state_dir=state, samples=samples_settings
    )
    engine = open_engine(settings.database_url)
    await upgrade(engine)
    context = HubContext(engine, settings, None, None, lambda: None)  # type: ignore[arg-type]
    runner = web.AppRunner(create_app(context, Tokens({admin_token: "admin"})))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield SampleHub(f"http://127.0.0.1:{runner.addresses[0][1]}", state, engine)
    finally:
        await runner.cleanup()
        await engine.dispose()
