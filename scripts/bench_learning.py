#!/usr/bin/env python3
"""The field-to-fleet loop on the zoo's digits model, measured end to end.

A distribution shift the model never saw — the scikit-learn digits drawn in a new colour
(dark ink on a light ground, the inverse of what ``digits_mnv3`` was trained on) — reaches
an agent in the field alongside ordinary traffic:

1. the agent (this tree's daemon, in-process) serves ``digits_mnv3`` with ``[capture]`` on;
   ``--shifted`` inverted digits and ``--field`` ordinary ones from the training split are
   classified through its HTTP API and captured (sealed spool);
2. its uploader sends them to a hub (the server's app, in-process);
3. a reviewer labels the inverted ones on the review route (the bench's reviewer knows each
   image's digit); the ordinary ones stay unreviewed;
4. ``edgeagent hub train`` fine-tunes the head (torch in ``.venv-build``), packages the result
   with ``edgeagent package`` (validated on a held-out split of the reviewed samples) and signs
   it as a canary release — timed, under ``taskset`` to ``--cores`` cores when available;
5. old and new model are scored on the package's own held-out set and on the same held-out
   digits inverted (never captured).

Goals: ≥ 10 points better on the inverted held-out digits, ≤ 1 point worse on the old held-out
set, training + packaging ≤ 5 minutes on 2 cores.

    python scripts/bench_learning.py [--shifted 200] [--field 300] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from devtools.figures import add_report_arguments, report  # noqa: E402
from devtools.sample_hub import sample_hub, write_device_tokens  # noqa: E402
from edgeagent.capture.uploader import Uploader  # noqa: E402
from edgeagent.config import parse_config  # noqa: E402
from edgeagent.daemon import Daemon  # noqa: E402
from edgeagent.hub.server.samples_settings import SamplesSettings  # noqa: E402

BUILD_PYTHON = ROOT / ".venv-build" / "bin" / "python"
ADMIN = "bench-admin-token-0123456789"
DEVICE_TOKEN = "bench-device-token-0123456789"
MAKE_DATA = """
import sys, numpy as np
sys.path.insert(0, sys.argv[2])
from modelbuild.data import digits_split
s = digits_split(32)
np.savez(sys.argv[1], train_x=s.train_images, train_y=s.train_labels,
         held_x=s.heldout_images, held_y=s.heldout_labels)
"""


def digits(work: Path) -> dict[str, np.ndarray]:
    """The zoo's digits split (scikit-learn lives in the build environment)."""
    path = work / "digits.npz"
    command = [str(BUILD_PYTHON), "-c", MAKE_DATA, str(path), str(ROOT / "scripts")]
    subprocess.run(command, check=True)
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


def png(pixels: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels[..., 0], mode="L").save(out, "PNG")
    return out.getvalue()


def accuracy(onnx: Path, x: np.ndarray, y: np.ndarray) -> float:
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    logits = np.concatenate(
        [session.run(None, {name: x[i : i + 64]})[0] for i in range(0, len(x), 64)]
    )
    return float((logits.argmax(1) == y).mean() * 100)


async def capture_and_upload(work: Path, images: list[bytes], hub_url: str) -> None:
    models = work / "models"
    shutil.copytree(ROOT / "zoo" / "digits_mnv3", models / "digits_mnv3")
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
        async with aiohttp.ClientSession(connector=connector) as http:
            for body in images:
                async with http.post("http://agent/v1/models/digits_mnv3/classify", data=body) as r:
                    r.raise_for_status()
        assert daemon.capture is not None
        await daemon.capture.drained()
        uploader = Uploader(config.capture, daemon.capture.spool, daemon.capture.audit)
        sent = await uploader.run_once()
        print(f"captured and uploaded {sent} samples", file=sys.stderr)
    finally:
        await daemon.stop()


def nearest(stored: bytes, sources: np.ndarray) -> int:
    """The source image a stored (JPEG) sample came from: the closest in pixels."""
    grey = np.asarray(Image.open(io.BytesIO(stored)).convert("L").resize((32, 32)), np.float32)
    return int(np.abs(sources - grey).reshape(len(sources), -1).sum(1).argmin())


async def review(hub, sources: np.ndarray, labels: np.ndarray, shifted: set[int]) -> int:
    done = 0
    headers = {"Authorization": f"Bearer {ADMIN}"}
    async with aiohttp.ClientSession(headers=headers) as http:
        for row in await hub.rows():
            index = nearest((hub.state / "samples" / row["blob"]).read_bytes(), sources)
            if index not in shifted:
                continue  # ordinary traffic stays unreviewed: the old model teaches on it
            truth = str(int(labels[index]))
            said = row["outputs"]["labels"][0]
            body = (
                {"status": "accepted"} if said == truth else {"status": "corrected", "label": truth}
            )
            async with http.post(f"{hub.url}/ui/samples/{row['id']}/review", json=body) as r:
                r.raise_for_status()
            done += 1
    return done


async def main_async(args: argparse.Namespace) -> dict:
    work = Path(tempfile.mkdtemp(prefix="bench-learning-"))
    data = digits(work)
    rng = np.random.default_rng(0)
    order = rng.permutation(len(data["train_x"]))
    shifted_ids = set(order[: args.shifted].tolist())
    field_ids = order[args.shifted : args.shifted + args.field].tolist()
    sources = data["train_x"].astype(np.float32)[..., 0].copy()
    for i in shifted_ids:
        sources[i] = 255 - sources[i]
    images = [png(255 - data["train_x"][i]) for i in shifted_ids]
    images += [png(data["train_x"][i]) for i in field_ids]
    rng.shuffle(images)
    tokens = write_device_tokens(work / "device-tokens", {"bench": ("lab", DEVICE_TOKEN)})
    settings = SamplesSettings(device_tokens=tokens, groups=("lab",))
    async with sample_hub(work / "hub", settings, ADMIN) as hub:
        await capture_and_upload(work, images, hub.url)
        reviewed = await review(hub, sources, data["train_y"], shifted_ids)
    keys = work / "keys"
    subprocess.run(
        [sys.executable, "-m", "edgeagent.cli", "hub", "keygen", str(keys)],
        check=True,
        capture_output=True,
    )
    out = work / "digits_mnv3-retrained"
    command = [
        sys.executable,
        "-m",
        "edgeagent.cli",
        "hub",
        "train",
        "--state-dir",
        str(work / "hub"),
    ]
    command += ["--model", "digits_mnv3", "--package", str(ROOT / "zoo" / "digits_mnv3")]
    command += ["--out", str(out), "--torch-python", str(BUILD_PYTHON), "--steps", str(args.steps)]
    command += ["--key", str(keys / "release.key"), "--base-url", "http://hub.example:8000"]
    command += ["--release-out", str(work / "releases"), "--json"]
    if shutil.which("taskset") and args.cores:
        command = ["taskset", "-c", ",".join(map(str, range(args.cores))), *command]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"hub train failed: {done.stderr}")
    summary = json.loads(done.stdout)
    with np.load(ROOT / "zoo" / "digits_mnv3" / "heldout.npz") as held:
        old_x, old_y = held["inputs"], held["labels"]
    inverted = -old_x  # the normalised inverse: (255 - p)/255 - 0.5) / 0.5 = -x
    before = ROOT / "zoo" / "digits_mnv3" / "digits_mnv3.fp32.onnx"
    after = next(out.glob("*.onnx"))
    figures = {
        "shifted_reviewed": reviewed,
        "field_unreviewed": len(field_ids),
        "old_heldout_before": accuracy(before, old_x, old_y),
        "old_heldout_after": accuracy(after, old_x, old_y),
        "shifted_heldout_before": accuracy(before, inverted, old_y),
        "shifted_heldout_after": accuracy(after, inverted, old_y),
        "train_package_sign_s": round(seconds, 1),
        "cores": args.cores,
        "release": bool(summary.get("release")),
        "training": summary["training"],
    }
    figures["shifted_gain_points"] = round(
        figures["shifted_heldout_after"] - figures["shifted_heldout_before"], 2
    )
    figures["old_change_points"] = round(
        figures["old_heldout_after"] - figures["old_heldout_before"], 2
    )
    shutil.rmtree(work, ignore_errors=True)
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--shifted", type=int, default=200, help="inverted digits captured and reviewed"
    )
    parser.add_argument(
        "--field", type=int, default=800, help="ordinary digits captured, unreviewed"
    )
    parser.add_argument("--steps", type=int, default=300, help="optimiser steps on the head")
    parser.add_argument(
        "--cores", type=int, default=2, help="taskset the training to this many cores"
    )
    add_report_arguments(parser)
    args = parser.parse_args()
    figures = asyncio.run(main_async(args))
    return report(figures, args)


if __name__ == "__main__":
    sys.exit(main())
