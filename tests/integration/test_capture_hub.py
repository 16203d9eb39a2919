"""Samples from devices to the hub and out as datasets: the device's uploader against the real
hub app (resumable with no duplicate, gated by group), a hostile client that stores nothing,
review through the dashboard's route, and COCO / YOLO / ImageFolder exports that
``supervision`` loads unchanged."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import numpy as np
import pytest
import supervision as sv
from PIL import Image

from devtools.sample_hub import (
    SampleHub,
    capture_samples,
    inference_event,
    sample_device,
    sample_hub,
    sample_jpeg,
    write_device_tokens,
)
from edgeagent.capture.audit import AuditLog
from edgeagent.capture.service import sample_record
from edgeagent.capture.spool import Spool, new_sample_id
from edgeagent.capture.uploader import Uploader
from edgeagent.cli import main
from edgeagent.fleet.samples import RECORD_HEADER, encode_record
from edgeagent.hub.server.samples_settings import SamplesSettings

ADMIN = "admin-token-0123456789"
TOKENS = {"dev-a": "device-a-token-0123456789", "dev-b": "device-b-token-0123456789"}
MAX_SAMPLE = 64 * 1024


@pytest.fixture
async def hub(tmp_path: Path) -> AsyncIterator[SampleHub]:
    tokens = write_device_tokens(
        tmp_path / "device-tokens",
        {"dev-a": ("lab", TOKENS["dev-a"]), "dev-b": ("field", TOKENS["dev-b"])},
    )
    settings = SamplesSettings(device_tokens=tokens, groups=("lab",), max_sample_bytes=MAX_SAMPLE)
    async with sample_hub(tmp_path / "hub", settings, ADMIN) as running:
        yield running


def _device(tmp: Path, device: str, hub_url: str) -> tuple[Spool, AuditLog, Uploader]:
    return sample_device(tmp, device, hub_url, TOKENS[device])


async def test_upload_resumes_without_duplicates_and_only_for_enabled_groups(
    tmp_path: Path, hub: SampleHub
) -> None:
    spool, audit, uploader = _device(tmp_path, "dev-a", hub.url)
    ids = capture_samples(spool, "dev-a", "digits", "classification", "3", 3)
    sealed = {i: (spool.directory / f"{i}.sample").read_bytes() for i in ids}
    assert await uploader.run_once() == 3
    assert spool.ids() == []
    assert [e["event"] for e in audit.entries()] == ["uploaded"] * 3
    rows = await hub.rows()
    assert sorted(r["sample_id"] for r in rows) == sorted(ids)
    assert {(r["model"], r["version"], r["device_id"]) for r in rows} == {
        ("digits", "1.0.0", "dev-a")
    }
    # Power lost after the hub stored a sample, before the device deleted it: the sample is
    # still in the spool after the restart and goes again — the hub keeps one copy.
    (spool.directory / f"{ids[0]}.sample").write_bytes(sealed[ids[0]])
    assert await uploader.run_once() == 1
    assert len(await hub.rows()) == 3 and len(hub.files()) == 3
    assert audit.entries()[-1]["stored"] is False

    # dev-b's group is not enabled: nothing leaves the device.
    spool_b, _, uploader_b = _device(tmp_path, "dev-b", hub.url)
    capture_samples(spool_b, "dev-b", "digits", "classification", "3", 1)
    assert await uploader_b.run_once() == 0
    assert uploader_b.allowed is False and len(spool_b.ids()) == 1


async def test_a_hostile_client_stores_nothing(tmp_path: Path, hub: SampleHub) -> None:
    good = sample_jpeg(90)
    sample_id = new_sample_id(1_700_000_000.0)
    event = inference_event("digits", "classification", "3", 1_700_000_000.0)
    record = sample_record(event, "dev-a", sample_id, 1.0, (32, 24), 0)
    url = f"{hub.url}/device/v1/samples/{sample_id}"

    async def put(token: str | None, body: bytes, record: dict | str, path: str = url) -> int:
        headers = {RECORD_HEADER: record if isinstance(record, str) else encode_record(record)}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        async with aiohttp.ClientSession() as http, http.put(path, data=body, headers=headers) as r:
            return r.status

    a, b = TOKENS["dev-a"], TOKENS["dev-b"]
    assert await put(None, good, record) == 401
    assert await put("not-a-device-token-at-all", good, record) == 401
    assert await put(b, good, dict(record, device_id="dev-b")) == 403  # group not enabled
    assert await put(a, good, dict(record, device_id="dev-b")) == 403  # another device's
    assert await put(a, b"\xff\xd8\xff" + os.urandom(MAX_SAMPLE), record) == 413
    assert await put(a, good, "bm90IGpzb24") == 400
    assert await put(a, good, dict(record, width=-1)) == 400
    assert await put(a, good, dict(record, model="..")) == 400  # it names a folder
    assert await put(a, b"GIF89a" + good, record) == 400
    assert await put(a, good[: len(good) // 2], record) == 400  # truncated JPEG
    assert await put(a, sample_jpeg(90, (40, 24)), record) == 400  # not the size it claims
    assert await put(a, good, dict(record, id=new_sample_id(1.0))) == 400  # not the path's
    assert await put(a, good, record, url.replace(sample_id, "..%2F..%2Fetc")) == 400
    # A body cut off mid-way (the device lost power while sending) stores nothing either.
    _, writer = await _open(hub.url)
    head = (
        f"PUT /device/v1/samples/{sample_id} HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {a}\r\n{RECORD_HEADER}: {encode_record(record)}\r\n"
        f"Content-Length: {len(good)}\r\n\r\n"
    )
    writer.write(head.encode() + good[:100])
    await writer.drain()
    writer.close()
    await writer.wait_closed()
    assert await hub.rows() == [] and hub.files() == []
    assert await put(a, good, record) == 201
    assert await put(a, sample_jpeg(10), record) == 409  # another image under a stored id
    assert len(await hub.rows()) == 1 and len(hub.files()) == 1


async def _open(url: str):
    host, port = url.removeprefix("http://").split(":")
    return await asyncio.open_connection(host, int(port))


async def test_review_and_exports_that_supervision_loads(tmp_path: Path, hub: SampleHub) -> None:
    spool, _, uploader = _device(tmp_path, "dev-a", hub.url)
    capture_samples(spool, "dev-a", "digits", "classification", "3", 3)
    capture_samples(spool, "dev-a", "boxes", "detection", "cat", 2)
    assert await uploader.run_once() == 5
    rows = {r["id"]: r for r in await hub.rows()}
    digits = sorted(i for i, r in rows.items() if r["model"] == "digits")
    boxes = sorted(i for i, r in rows.items() if r["model"] == "boxes")
    auth = {"Authorization": f"Bearer {ADMIN}"}
    dog = {"status": "corrected", "detections": [{"label": "dog", "box": [1, 2, 30, 20]}]}
    verdicts = [
        (digits[0], {"status": "accepted"}),
        (digits[1], {"status": "corrected", "label": "8"}),
        (digits[2], {"status": "rejected"}),
        (boxes[0], {"status": "accepted"}),
        (boxes[1], dog),
    ]
    async with aiohttp.ClientSession(headers=auth) as http:
        for row_id, body in verdicts:
            async with http.post(f"{hub.url}/ui/samples/{row_id}/review", json=body) as r:
                assert r.status == 200, await r.text()
        bad = {"status": "corrected", "detections": [{"label": "dog", "box": [1, 2, 99, 20]}]}
        async with http.post(f"{hub.url}/ui/samples/{boxes[1]}/review", json=bad) as r:
            assert r.status == 400
        async with http.get(f"{hub.url}/ui/samples/digits/1.0.0") as r:
            page = await r.text()
            assert r.status == 200 and "img-src 'self'" in r.headers["Content-Security-Policy"]
        assert page.count("data-verdict='corrected'") == 3
        async with http.get(f"{hub.url}/ui/samples/image/{digits[0]}") as r:
            assert r.status == 200 and (await r.read()).startswith(b"\xff\xd8\xff")
    image = f"{hub.url}/ui/samples/image/{digits[0]}"
    async with aiohttp.ClientSession() as http, http.get(image, allow_redirects=False) as r:
        assert r.status == 303  # no token: to the sign-in page, no image

    async def export(model: str, fmt: str) -> Path:
        out = tmp_path / f"{model}-{fmt}"
        command = ["hub", "export", "--state-dir", str(hub.state), "--model", model]
        command += ["--format", fmt, "--out", str(out)]
        assert await asyncio.to_thread(main, command) == 0  # the CLI's own asyncio.run
        return out

    folder_dir = await export("digits", "imagefolder")
    folder = sv.ClassificationDataset.from_folder_structure(str(folder_dir))
    assert len(folder) == 2 and sorted(folder.classes) == ["3", "8"]  # rejected left out
    coco_dir = await export("boxes", "coco")
    coco = sv.DetectionDataset.from_coco(
        str(coco_dir / "images"), str(coco_dir / "annotations.json")
    )
    yolo_dir = await export("boxes", "yolo")
    yolo = sv.DetectionDataset.from_yolo(
        str(yolo_dir / "images"), str(yolo_dir / "labels"), str(yolo_dir / "data.yaml")
    )
    for dataset in (coco, yolo):
        assert sorted(dataset.classes) == ["cat", "dog"] and len(dataset) == 2
        found = {
            (dataset.classes[int(c)], tuple(np.round(box).astype(int)))
            for _, _, detections in dataset
            for box, c in zip(detections.xyxy, detections.class_id, strict=True)
        }
        assert found == {("cat", (4, 4, 20, 12)), ("dog", (1, 2, 30, 20))}
    shutil.rmtree(coco_dir)


REPO = Path(__file__).resolve().parents[2]
BUILD_PYTHON = REPO / ".venv-build" / "bin" / "python"
ZOO_DIGITS = REPO / "zoo" / "digits_mnv3"


def _digit_jpegs(count: int) -> list[tuple[bytes, int]]:
    """Held-out digits of the zoo's package back as images (white on black), with labels."""
    with np.load(ZOO_DIGITS / "heldout.npz") as data:
        x, y = data["inputs"][:count], data["labels"][:count]
    out = []
    for tensor, label in zip(x, y, strict=True):
        pixels = np.clip((tensor[0] * 0.5 + 0.5) * 255, 0, 255).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels, mode="L").save(buffer, "JPEG", quality=95)
        out.append((buffer.getvalue(), int(label)))
    return out


async def _train_command(tmp_path: Path, hub: SampleHub, out: Path) -> list[str]:
    """Sixteen digits captured on a device and uploaded, twelve reviewed (four stay new, for
    the old model to teach), a release key: ``hub train``'s command line for them."""
    spool, _, uploader = _device(tmp_path, "dev-a", hub.url)
    for index, (jpeg, label) in enumerate(_digit_jpegs(16)):
        event = inference_event(
            "digits_mnv3", "classification", str(label), 1_700_000_000.0 + index
        )
        sample_id = new_sample_id(event.at)
        spool.write(sample_id, sample_record(event, "dev-a", sample_id, 1.0, (32, 32), 0), jpeg)
    assert await uploader.run_once() == 16
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {ADMIN}"}) as http:
        for row in (await hub.rows())[:12]:
            async with http.post(
                f"{hub.url}/ui/samples/{row['id']}/review", json={"status": "accepted"}
            ) as r:
                assert r.status == 200
    assert await asyncio.to_thread(main, ["hub", "keygen", str(tmp_path / "keys")]) == 0
    command = ["hub", "train", "--state-dir", str(hub.state), "--model", "digits_mnv3"]
    command += ["--package", str(ZOO_DIGITS), "--out", str(out)]
    command += ["--heldout-percent", "30", "--torch-python", str(BUILD_PYTHON)]
    command += ["--variants", "graph"]
    command += ["--key", str(tmp_path / "keys" / "release.key"), "--base-url", "http://h:1"]
    return [*command, "--release-out", str(tmp_path / "releases")]


def _signed_canary(releases: Path) -> dict:
    (release,) = releases.glob("*.release.json")
    return json.loads(base64.b64decode(json.loads(release.read_text())["payload"]))


@pytest.mark.slow
@pytest.mark.skipif(not BUILD_PYTHON.exists(), reason="no .venv-build (torch) in this checkout")
async def test_hub_train_fine_tunes_packages_and_signs_a_canary(tmp_path: Path, hub: SampleHub):
    import onnx
    import onnx.numpy_helper

    out = tmp_path / "retrained"
    command = [*await _train_command(tmp_path, hub, out), "--steps", "3"]
    assert await asyncio.to_thread(main, command) == 0
    from edgeagent.models.package import load_package

    package = load_package(out)
    assert (package.name, package.version) == ("digits_mnv3", "1.1.0")
    assert package.variant("onnxruntime", "fp32") is not None
    old = onnx.load(str(ZOO_DIGITS / "digits_mnv3.fp32.onnx"))
    new = onnx.load(str(next(out.glob("*.onnx"))))
    weights = {
        i.name: onnx.numpy_helper.to_array(i) for i in new.graph.initializer if "weight" in i.name
    }
    changed = {
        i.name
        for i in old.graph.initializer
        if i.name in weights and not np.array_equal(onnx.numpy_helper.to_array(i), weights[i.name])
    }
    assert changed == {"classifier.0.weight", "classifier.3.weight"}  # the head, nothing else
    manifest = _signed_canary(tmp_path / "releases")
    assert manifest["canary"]["share"] == 0.1 and manifest["version"] == "1.1.0"


@pytest.mark.slow
@pytest.mark.skipif(not BUILD_PYTHON.exists(), reason="no .venv-build (torch) in this checkout")
async def test_hub_train_distils_a_smaller_student_and_signs_it(tmp_path: Path, hub: SampleHub):
    from edgeagent.models.package import load_package

    out = tmp_path / "student"
    command = await _train_command(tmp_path, hub, out)
    command += ["--distil", f"{REPO / 'tests' / 'support' / 'tiny_student.py'}:make"]
    assert await asyncio.to_thread(main, [*command, "--epochs", "2"]) == 0
    report = json.loads((out / "validation.json").read_text())
    figures = report["distillation"]
    reviewed_train = figures["labelled"]
    assert figures["rows"] == 16 - report["rows"] and figures["rows"] - reviewed_train == 4
    assert figures["teacher"] == "digits_mnv3 1.0.0" and figures["epochs"] == 2
    assert figures["parameters"] < 20_000  # the student, not a copy of the teacher
    package = load_package(out)
    assert (package.name, package.version) == ("digits_mnv3", "1.1.0")
    assert package.labels == load_package(ZOO_DIGITS).labels
    assert _signed_canary(tmp_path / "releases")["version"] == "1.1.0"


@pytest.mark.parametrize(
    ("extra", "refusal"),
    [
        (["--heldout-percent", "0"], "--heldout-percent 0.0: a share between 0 and 100"),
        (["--heldout-percent", "100"], "--heldout-percent 100.0: a share between 0 and 100"),
        ([], "0 reviewed samples of digits_mnv3: too few for a training and a held-out set"),
    ],
)
async def test_hub_train_refuses_a_share_or_a_sample_set_it_cannot_split(
    tmp_path: Path, hub: SampleHub, capsys: pytest.CaptureFixture[str], extra, refusal
) -> None:
    out = tmp_path / "retrained"
    command = ["hub", "train", "--state-dir", str(hub.state), "--model", "digits_mnv3"]
    command += ["--package", str(ZOO_DIGITS), "--out", str(out), *extra]
    assert await asyncio.to_thread(main, command) != 0
    assert refusal in capsys.readouterr().err and not out.exists()
