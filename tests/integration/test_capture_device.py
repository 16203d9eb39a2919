"""Capture on the device, through the daemon's HTTP API: rules and caps, the sealed spool, the
audit log, redaction by a served detector, ``no_capture`` packages, and ``capture purge``."""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
from pathlib import Path

import aiohttp
import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from PIL import Image

from devtools.package import add_field, set_fields
from devtools.plaintext import plaintext_images
from edgeagent.capture.spool import Spool, spool_key
from edgeagent.config import parse_config
from edgeagent.daemon import Daemon
from edgeagent.models.seal_crypto import SealingError

ZOO = Path(__file__).resolve().parents[2] / "zoo"
PHOTOS = Path(__file__).resolve().parents[2] / "third-party-models" / "photos"


def _config(tmp: Path, models: list[str], capture: str) -> str:
    return (
        f"[agent]\nstate_dir = '{tmp / 'state'}'\nmodels_dir = '{tmp / 'models'}'\n"
        f"models = {models!r}\n"
        f"[server]\nunix_socket = '{tmp / 'agent.sock'}'\ntcp_port = 0\n"
        f"[capture]\nenabled = true\n{capture}"
    )


async def _serve(tmp: Path, models: list[str], capture: str):
    daemon = Daemon(parse_config(_config(tmp, models, capture)))
    await daemon.start()
    connector = aiohttp.UnixConnector(path=str(daemon.config.server.unix_socket))
    session = aiohttp.ClientSession(connector=connector, base_url="http://agent")
    return daemon, session


@pytest.fixture
def models(tmp_path: Path) -> Path:
    root = tmp_path / "models"
    shutil.copytree(ZOO / "digits_mnv3", root / "digits_mnv3")
    blocked = root / "private_digits"
    shutil.copytree(ZOO / "digits_mnv3", blocked)
    set_fields(blocked, {"name": "private_digits"})
    add_field(blocked, "capture", {"no_capture": True})
    return root


async def test_capture_keeps_sealed_samples_within_caps_and_purge_deletes_them(
    tmp_path: Path, models: Path
) -> None:
    daemon, client = await _serve(
        tmp_path,
        ["digits_mnv3", "private_digits"],
        "sample_percent = 100.0\nper_minute = 3\nmax_image_side = 16\n",
    )
    digit = (ZOO / "samples" / "digit_3.jpg").read_bytes()
    try:
        for _ in range(6):
            async with client.post("/v1/models/digits_mnv3/classify", data=digit) as answer:
                assert answer.status == 200
        async with client.post("/v1/models/private_digits/classify", data=digit) as answer:
            assert answer.status == 200
        assert daemon.capture is not None
        await daemon.capture.drained()
        async with client.get("/v1/status") as answer:
            status = (await answer.json())["capture"]
        async with client.get("/metrics") as answer:
            metrics = await answer.text()
    finally:
        await client.close()
        await daemon.stop()
    assert status["samples"] == 3
    assert status["outcomes"] == {"captured": 3, "per_minute": 3, "no_capture": 1}
    assert 'edgeagent_capture_outcomes_total{model="digits_mnv3",outcome="per_minute"} 3.0' in (
        metrics
    )
    spool = daemon.capture.spool
    sample = spool.read(spool.ids()[0])
    record = sample.record
    assert (record["model"], record["version"], record["task"]) == (
        "digits_mnv3",
        "1.0.0",
        "classification",
    )
    assert record["variant"].startswith(("onnxruntime/", "openvino/", "litert/"))
    assert record["outputs"]["labels"][0] == "3"
    assert max(Image.open(io.BytesIO(sample.image)).size) <= 16
    # The state directory holds no image in the clear, though three were captured.
    state = tmp_path / "state"
    assert plaintext_images(state) == []
    events = [e["event"] for e in daemon.capture.audit.entries()]
    assert events.count("captured") == 3

    # Another device's key opens none of them.
    other = Spool(spool.directory, lambda: spool_key(X25519PrivateKey.generate()), 1 << 20)
    with pytest.raises(SealingError, match="does not authenticate"):
        other.read(spool.ids()[0])
    (state / "device-key.pem").unlink()  # purge needs no key
    config = tmp_path / "agent.toml"
    config.write_text(_config(tmp_path, ["digits_mnv3"], ""))
    cli = [sys.executable, "-m", "edgeagent.cli", "capture", "--config", str(config)]
    dry = subprocess.run([*cli, "purge"], capture_output=True, text=True, timeout=60)
    assert dry.returncode == 1 and "3 sample(s)" in dry.stdout
    done = subprocess.run([*cli, "purge", "--yes"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert spool.ids() == []
    deleted = [e for e in daemon.capture.audit.entries() if e["event"] == "deleted"]
    assert len(deleted) == 3 and {e["reason"] for e in deleted} == {"purge"}


async def _redacting(tmp: Path, capture: str = ""):
    """The daemon serving coco_ssd, capturing everything and blurring people with it."""
    shutil.copytree(ZOO / "coco_ssd", tmp / "models" / "coco_ssd")
    return await _serve(
        tmp,
        ["coco_ssd"],
        "sample_percent = 100.0\nmax_image_side = 4096\n"
        f"redact_detector = 'coco_ssd'\nredact_labels = ['person']\n{capture}",
    )


async def test_a_served_detector_blurs_people_before_anything_is_written(tmp_path: Path) -> None:
    daemon, client = await _redacting(tmp_path, "jpeg_quality = 95\n")
    photo = (PHOTOS / "astronaut.png").read_bytes()
    try:
        async with client.post("/v1/models/coco_ssd/detect", data=photo) as answer:
            assert answer.status == 200
            found = await answer.json()
        await daemon.capture.drained()
    finally:
        await client.close()
        await daemon.stop()
    people = [d for d in found["detections"] if d["label"] == "person" and d["score"] >= 0.3]
    assert people, "the photo shows a person"
    spool = daemon.capture.spool
    (sample_id,) = spool.ids()
    sample = spool.read(sample_id)
    assert sample.record["redacted_regions"] == len(people)
    stored = np.asarray(Image.open(io.BytesIO(sample.image)).convert("L"), float)
    original = np.asarray(Image.open(PHOTOS / "astronaut.png").convert("L"), float)
    x1, y1, x2, y2 = (int(v) for v in people[0]["box"])
    inside_stored = np.abs(np.diff(stored[y1:y2, x1:x2], axis=1)).mean()
    inside_original = np.abs(np.diff(original[y1:y2, x1:x2], axis=1)).mean()
    assert inside_stored < inside_original / 3  # the person's detail is gone
    assert plaintext_images(tmp_path / "state") == []


async def test_camera_and_zmq_frames_are_captured_and_redacted_like_uploads(
    tmp_path: Path,
) -> None:
    """A camera's decoded frame (``detect_frame``, what a ``[[stream]]`` pipeline calls) and
    Frigate's RGB pixels (``detect_pixels``, what the ``[zmq]`` detector calls) reach capture
    as frames; each kept one is encoded, redacted and sealed as an upload is."""
    daemon, client = await _redacting(tmp_path)
    photo = Image.open(PHOTOS / "astronaut.png").convert("RGB")
    try:
        await daemon.dataplane.detect_frame("coco_ssd", photo, priority=1)
        await daemon.dataplane.detect_pixels("coco_ssd", np.asarray(photo))
        assert daemon.capture is not None
        await daemon.capture.drained()
    finally:
        await client.close()
        await daemon.stop()
    spool = daemon.capture.spool
    samples = [spool.read(sample_id) for sample_id in spool.ids()]
    assert len(samples) == 2
    for sample in samples:
        labels = {d["label"] for d in sample.record["outputs"]["detections"]}
        assert "person" in labels and sample.record["redacted_regions"] >= 1
        assert Image.open(io.BytesIO(sample.image)).size == photo.size
    assert plaintext_images(tmp_path / "state") == []
