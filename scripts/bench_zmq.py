#!/usr/bin/env python3
"""Frigate's zmq detector against the DeepStack route, on one daemon serving the COCO detector.

One ``edgeagent run`` serves a copy of the package (its onnxruntime fp32 variant only) with
``[server] deepstack_model`` naming it and ``[zmq]`` on an IPC endpoint. The frame is what
Frigate hands a detector: a real photo (``zoo/samples``) resized to the model's input size,
height × width × 3 uint8. Rounds alternate the two routes, ``--requests`` frames each, one
client at a time (Frigate's detector process is one):

- **zmq**: Frigate's own plugin (``tests/fixtures/frigate``, ``zmq_ipc.py`` verbatim) calling
  ``detect_raw`` — the JSON header and the raw frame over the socket, 20 × 6 rows back;
- **deepstack**: what Frigate's ``deepstack`` plugin does per frame — the frame encoded as JPEG
  with Pillow, posted as multipart ``image`` with ``api_key`` over a kept-alive TCP session,
  the JSON predictions read back;
- **model**: the daemon's own compute time per request over the zmq round (the v2 statistics
  extension's ``compute_infer``: the runtime alone, no transport, no pre- or postprocessing).

Figures are medians over rounds of each round's mean; the ratios are taken within a round
(zmq over model; deepstack over zmq), then their median, so drift hits both sides alike.

    python scripts/bench_zmq.py --json          # zoo/coco_ssd, zoo/samples/scene.jpg
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import requests
from PIL import Image

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from devtools.bench_daemon import start_daemon, stop_tree, wait_ready  # noqa: E402
from devtools.http_endpoint import http_client  # noqa: E402
from devtools.package import pinned_package  # noqa: E402
from devtools.zoo import zoo_dir  # noqa: E402
from edgeagent.models.package import load_package  # noqa: E402

FRIGATE = REPO / "tests" / "fixtures" / "frigate"


def frigate_frame(image: Path, size: tuple[int, int]) -> np.ndarray:
    """The photo as Frigate hands it to a detector: resized to the model's input, NHWC uint8."""
    height, width = size
    rgb = Image.open(image).convert("RGB").resize((width, height), Image.Resampling.BILINEAR)
    return np.asarray(rgb, np.uint8)[None]


def zmq_client(endpoint: str, size: tuple[int, int]):
    """Frigate's zmq detector, its plugin file unchanged."""
    sys.path.insert(0, str(FRIGATE))
    from frigate.detectors.detector_config import ModelConfig
    from frigate.detectors.plugins import zmq_ipc

    config = zmq_ipc.ZmqDetectorConfig(
        type="zmq",
        endpoint=endpoint,
        request_timeout_ms=30_000,
        model=ModelConfig(path="model.onnx", width=size[1], height=size[0]),
    )
    detector = zmq_ipc.ZmqIpcDetector(config)
    if not detector._model_ready:
        raise SystemExit("Frigate's zmq detector found no model ready on the agent")
    return detector


def deepstack_client(url: str, token: str):
    """What Frigate's deepstack plugin does with each frame (its detect_raw, minus the label
    map: JPEG by Pillow, multipart POST on a requests.Session, the JSON read)."""
    session = requests.Session()

    def detect(frame: np.ndarray) -> list:
        image = Image.fromarray(np.squeeze(frame).astype(np.uint8))
        with io.BytesIO() as output:
            image.save(output, format="JPEG")
            data = output.getvalue()
        answer = session.post(url, data={"api_key": token}, files={"image": data}, timeout=30)
        answer.raise_for_status()
        return answer.json()["predictions"]

    return detect


async def compute_ns(sock: Path, model: str) -> tuple[int, int]:
    """(requests, compute ns) of the model so far, from the v2 statistics extension."""
    async with http_client(sock) as client, client.get(f"/v2/models/{model}/stats") as answer:
        stats = (await answer.json())["model_stats"]
    infer = [s["inference_stats"]["compute_infer"] for s in stats]
    return sum(i["count"] for i in infer), sum(i["ns"] for i in infer)


def timed(call, frame: np.ndarray, requests_: int) -> list[float]:
    latencies = []
    for _ in range(requests_):
        began = time.perf_counter()
        call(frame)
        latencies.append(time.perf_counter() - began)
    return latencies


async def run(args: argparse.Namespace) -> dict:
    work = Path(tempfile.mkdtemp(prefix="bench-zmq-"))
    source = load_package(args.model)
    package = pinned_package(args.model, "fp32", work / "package" / source.name)
    assert source.preprocess is not None
    size = (source.preprocess.size[0], source.preprocess.size[1])
    endpoint = f"ipc://{work / 'zmq_detector'}"
    daemon = start_daemon(
        package,
        work,
        threads=args.threads,
        peers=True,
        server=f"deepstack_model = '{source.name}'",
        tables=f"[zmq]\nenabled = true\nendpoint = '{endpoint}'\nmodel = '{source.name}'\n",
    )
    try:
        await wait_ready(daemon.sock, daemon.process)
        frame = frigate_frame(args.image, size)
        zmq = await asyncio.to_thread(zmq_client, endpoint, size)
        url = f"http://127.0.0.1:{daemon.tcp_port}/v1/vision/detection"
        deepstack = deepstack_client(url, daemon.token)
        rows = await asyncio.to_thread(zmq.detect_raw, frame)
        predictions = await asyncio.to_thread(deepstack, frame)
        for call in (zmq.detect_raw, deepstack):  # warm both paths
            await asyncio.to_thread(timed, call, frame, 5)
        rounds = []
        for index in range(args.rounds):
            order = ["zmq", "deepstack"] if index % 2 == 0 else ["deepstack", "zmq"]
            figures: dict[str, float] = {}
            for route in order:
                if route == "zmq":
                    before = await compute_ns(daemon.sock, source.name)
                    latencies = await asyncio.to_thread(timed, zmq.detect_raw, frame, args.requests)
                    after = await compute_ns(daemon.sock, source.name)
                    count = after[0] - before[0]
                    figures["model_ms"] = (after[1] - before[1]) / max(1, count) / 1e6
                else:
                    latencies = await asyncio.to_thread(timed, deepstack, frame, args.requests)
                figures[f"{route}_ms"] = statistics.mean(latencies) * 1e3
                figures[f"{route}_p50_ms"] = statistics.median(latencies) * 1e3
            figures["zmq_over_model"] = figures["zmq_ms"] / figures["model_ms"]
            figures["deepstack_over_zmq"] = figures["deepstack_ms"] / figures["zmq_ms"]
            rounds.append(figures)
    finally:
        stop_tree(daemon.process)
    keys = rounds[0].keys()
    return {
        "model": source.name,
        "image": args.image.name,
        "frame": list(frame.shape),
        "requests_per_round": args.requests,
        "detections_zmq": int(np.count_nonzero(rows[:, 1])),
        "detections_deepstack": sum(1 for p in predictions if p["confidence"] >= 0.4),
        "rounds": rounds,
        "median": {key: statistics.median(r[key] for r in rounds) for key in keys},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=zoo_dir() / "coco_ssd")
    parser.add_argument("--image", type=Path, default=zoo_dir() / "samples" / "scene.jpg")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds")
    parser.add_argument("--requests", type=int, default=50, help="frames per route and round")
    parser.add_argument("--threads", type=int, default=0, help="[hardware] threads (0: all)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    report = asyncio.run(run(args))
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(json.dumps(report["median"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
