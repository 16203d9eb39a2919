"""The field-to-fleet loop's moving parts, as the learning benches drive them.

A real agent (this tree's daemon, in-process) serves a zoo package with ``[capture]`` on and
is sent the field's images through its HTTP API; its uploader sends what it captured to a hub;
a reviewer works through the hub's review route; ``edgeagent hub train`` retrains, packages
and signs, timed under ``taskset``. The benches differ only in their data, their reviewer and
how they score a model: those stay in each bench.
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
from PIL import Image

from devtools.sample_hub import SampleHub, sample_hub, write_device_tokens
from edgeagent.capture.uploader import Uploader
from edgeagent.config import parse_config
from edgeagent.daemon import Daemon
from edgeagent.hub.server.samples_settings import SamplesSettings

ROOT = Path(__file__).resolve().parents[1]
BUILD_PYTHON = ROOT / ".venv-build" / "bin" / "python"
ADMIN = "bench-admin-token-0123456789"
DEVICE_TOKEN = "bench-device-token-0123456789"


def png(pixels: np.ndarray) -> bytes:
    """An image array (grey HxWx1 or RGB HxWx3) as the PNG a client would post."""
    out = io.BytesIO()
    Image.fromarray(pixels[..., 0] if pixels.shape[-1] == 1 else pixels).save(out, "PNG")
    return out.getvalue()


async def capture_and_upload(
    work: Path, package: Path, route: str, images: list[bytes], hub_url: str
) -> int:
    """Post every image to ``/v1/models/<name>/<route>`` of an agent capturing all it answers,
    then upload its samples to ``hub_url``; how many were uploaded."""
    models = work / "models"
    shutil.copytree(package, models / package.name)
    token = work / "device.token"
    token.write_text(DEVICE_TOKEN)
    token.chmod(0o600)
    config = parse_config(
        f"[agent]\nstate_dir = '{work / 'state'}'\nmodels_dir = '{models}'\ndevice_id = 'bench'\n"
        f"[server]\nunix_socket = '{work / 'agent.sock'}'\ntcp_port = 0\n"
        "[capture]\nenabled = true\nsample_percent = 100.0\nper_minute = 0\nper_hour = 0\n"
        f"per_day = 0\nqueue_size = {len(images)}\n"
        f"upload = true\nhub_url = '{hub_url}'\ntoken_file = '{token}'\n"
        "bandwidth_bytes_per_s = 100000000\nupload_interval_s = 3600\n"
    )
    daemon = Daemon(config)
    await daemon.start()
    try:
        connector = aiohttp.UnixConnector(path=str(config.server.unix_socket))
        url = f"http://agent/v1/models/{package.name}/{route}"
        async with aiohttp.ClientSession(connector=connector) as http:
            for body in images:
                async with http.post(url, data=body) as answer:
                    answer.raise_for_status()
        assert daemon.capture is not None
        await daemon.capture.drained()
        uploader = Uploader(config.capture, daemon.capture.spool, daemon.capture.audit)
        sent = await uploader.run_once()
        print(f"captured and uploaded {sent} samples", file=sys.stderr)
        return sent
    finally:
        await daemon.stop()


def nearest(stored: bytes, sources: np.ndarray) -> int:
    """The source image a stored (JPEG) sample came from: the closest in pixels.

    ``sources`` are ``[N, 32, 32]`` grey thumbnails (``thumbnails``)."""
    grey = np.asarray(Image.open(io.BytesIO(stored)).convert("L").resize((32, 32)), np.float32)
    return int(np.abs(sources - grey).reshape(len(sources), -1).sum(1).argmin())


def thumbnails(images: np.ndarray) -> np.ndarray:
    """``[N, H, W, C]`` uint8 images as the ``[N, 32, 32]`` grey thumbnails ``nearest`` reads."""
    return np.stack(
        [
            np.asarray(
                Image.fromarray(i[..., 0] if i.shape[-1] == 1 else i).convert("L").resize((32, 32)),
                np.float32,
            )
            for i in images
        ]
    )


async def review(
    hub: SampleHub, sources: np.ndarray, verdict: Callable[[int, dict], dict | None]
) -> int:
    """Post ``verdict(source index, row)`` for each stored sample (None: left unreviewed);
    how many were reviewed."""
    done = 0
    headers = {"Authorization": f"Bearer {ADMIN}"}
    async with aiohttp.ClientSession(headers=headers) as http:
        for row in await hub.rows():
            index = nearest((hub.state / "samples" / row["blob"]).read_bytes(), sources)
            body = verdict(index, row)
            if body is None:
                continue
            async with http.post(f"{hub.url}/ui/samples/{row['id']}/review", json=body) as r:
                r.raise_for_status()
            done += 1
    return done


def train_and_sign(
    work: Path, model: str, package: Path, steps: int, cores: int
) -> tuple[dict[str, Any], float, Path]:
    """``edgeagent hub train`` on the hub's state under ``work``, signed as a canary: its
    summary, how long it took, and the new package."""
    keys = work / "keys"
    cli = [sys.executable, "-m", "edgeagent.cli"]
    subprocess.run([*cli, "hub", "keygen", str(keys)], check=True, capture_output=True)
    out = work / f"{model}-retrained"
    command = [*cli, "hub", "train", "--state-dir", str(work / "hub"), "--model", model]
    command += ["--package", str(package), "--out", str(out)]
    command += ["--torch-python", str(BUILD_PYTHON), "--steps", str(steps)]
    command += ["--key", str(keys / "release.key"), "--base-url", "http://hub.example:8000"]
    command += ["--release-out", str(work / "releases"), "--json"]
    if shutil.which("taskset") and cores:
        command = ["taskset", "-c", ",".join(map(str, range(cores))), *command]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"hub train failed: {done.stderr}")
    return json.loads(done.stdout), seconds, out


async def field_to_hub(
    work: Path,
    package: Path,
    route: str,
    images: list[bytes],
    sources: np.ndarray,
    verdict: Callable[[int, dict], dict | None],
) -> int:
    """Steps 1-3 of the loop: ``images`` served and captured by an agent, uploaded to a hub
    whose state is ``work/hub``, reviewed there (``sources``: what each sample came from, as
    ``thumbnails``); how many were reviewed."""
    tokens = write_device_tokens(work / "device-tokens", {"bench": ("lab", DEVICE_TOKEN)})
    settings = SamplesSettings(device_tokens=tokens, groups=("lab",))
    async with sample_hub(work / "hub", settings, ADMIN) as hub:
        await capture_and_upload(work, package, route, images, hub.url)
        return await review(hub, sources, verdict)


def add_training_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--steps", type=int, default=300, help="optimiser steps on the head")
    parser.add_argument(
        "--cores", type=int, default=2, help="taskset the training to this many cores"
    )
