"""A hub server's app in-process for the samples routes (no broker): for tests and benches.

The sample routes need only the database and the settings, so the app is served with no
ingest, MQTT link or controller; everything else about it is the server's own ``create_app``.
The devices' side is here too: a device's spool, audit log and uploader, and samples captured
into that spool, so every test of the hub's samples uploads the way a device does.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import sqlalchemy as sa
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from PIL import Image

from edgeagent.capture.audit import AuditLog
from edgeagent.capture.service import sample_record
from edgeagent.capture.settings import CaptureSettings
from edgeagent.capture.spool import Spool, new_sample_id, spool_key
from edgeagent.capture.uploader import Uploader
from edgeagent.engine.hooks import InferenceEvent
from edgeagent.hub.blobs import BlobStore
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
    state: Path, samples_settings: SamplesSettings, admin_token: str, blobs: BlobStore | None = None
) -> AsyncIterator[SampleHub]:
    """The app on a loopback port; its images go to ``blobs`` (default: what the settings name)."""
    settings = ServerSettings(
        database_url=f"sqlite:///{state / 'hub.db'}", state_dir=state, samples=samples_settings
    )
    engine = open_engine(settings.database_url)
    await upgrade(engine)
    context = HubContext(engine, settings, None, None, lambda: None)  # type: ignore[arg-type]
    runner = web.AppRunner(create_app(context, Tokens({admin_token: "admin"}), blobs))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield SampleHub(f"http://127.0.0.1:{runner.addresses[0][1]}", state, engine)
    finally:
        await runner.cleanup()
        await engine.dispose()


def sample_jpeg(value: int, size: tuple[int, int] = (32, 24)) -> bytes:
    """A small JPEG of one grey ``value`` with a lighter box (distinct bytes per value)."""
    out = io.BytesIO()
    pixels = np.full((size[1], size[0], 3), value, np.uint8)
    pixels[4:12, 4:20] = 255 - value
    Image.fromarray(pixels).save(out, "JPEG", quality=90)
    return out.getvalue()


def inference_event(model: str, task: str, label: str, at: float) -> InferenceEvent:
    """What a device's data plane hands capture: a low-confidence ``label`` (a class or a box)."""
    if task == "classification":
        answer = {"labels": [label, "x"], "scores": [0.55, 0.2]}
    else:
        answer = {"detections": [{"label": label, "score": 0.6, "box": [4.0, 4.0, 20.0, 12.0]}]}
    return InferenceEvent(model, "1.0.0", task, "onnxruntime/fp32@cpu", b"", answer, at=at)


def sample_device(
    tmp: Path, device: str, hub_url: str, upload_token: str
) -> tuple[Spool, AuditLog, Uploader]:
    """A device's sealed spool, audit log and uploader (no bandwidth cap) under ``tmp``."""
    key = spool_key(X25519PrivateKey.generate())
    token = tmp / f"{device}.token"
    token.write_text(upload_token)
    token.chmod(0o600)
    settings = CaptureSettings(
        upload=True, hub_url=hub_url, token_file=token, bandwidth_bytes_per_s=10**9
    )
    spool = Spool(tmp / device / "spool", lambda: key, 1 << 24)
    audit = AuditLog(tmp / device)
    return spool, audit, Uploader(settings, spool, audit)


def capture_samples(
    spool: Spool, device: str, model: str, task: str, label: str, n: int
) -> list[str]:
    """``n`` samples of ``model`` captured into ``spool`` as the device would; their ids."""
    ids = []
    for i in range(n):
        event = inference_event(model, task, label, 1_700_000_000.0 + i)
        sample_id = new_sample_id(event.at)
        record = sample_record(event, device, sample_id, 1.0, (32, 24), 0)
        spool.write(sample_id, record, sample_jpeg(40 + 20 * i))
        ids.append(sample_id)
    return ids
