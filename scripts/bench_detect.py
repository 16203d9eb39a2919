#!/usr/bin/env python3
"""Detection benchmark: every variant of the zoo detector, raw runtime vs the daemon's
DeepStack route, plus mAP@0.5 of each variant as the daemon serves it.

Per variant (runtime × precision) one ``edgeagent run`` daemon serves a copy of the package
that offers only that variant, with ``[server] deepstack_model`` naming it. The cells:

- **raw**: the in-process session of the same variant, batch 1, on the preprocessed frame
  (the runtime alone: no image decoding, no head decoding, no HTTP);
- **pipeline**: the same in process from the JPEG bytes — decode, letterbox, run, decode the
  head and NMS — which is what the daemon does per request besides HTTP;
- **served c1 / c4**: ``POST /v1/vision/detection`` over the Unix socket, a multipart JPEG
  ``image`` field as Frigate's deepstack plugin sends it (a 320×320 frame), 1 and 4 clients.

Rounds alternate raw and served cells and every figure is the median over rounds, so drift in
the machine's load hits both sides alike; compare ratios within one run. mAP@0.5 is measured
on the package's held-out scenes posted as PNG to the same route (DeepStack's integer boxes).
With ``--photos`` it is measured on real photos against hand-labelled boxes instead (the COCO
detector: tests/fixtures/coco_photo_boxes.toml), asking ``min_confidence`` down to the decode
floor so the whole precision/recall curve counts; the served frame is then the first photo.

    python scripts/bench_detect.py                    # zoo/shapes_grid_mnv2, 5 rounds × 2 s
    python scripts/bench_detect.py --rounds 5 --seconds 3 --json
    python scripts/bench_detect.py --model zoo/coco_ssd \
        --photos tests/fixtures/coco_photo_boxes.toml  # the COCO detector on real photos
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import tomllib
from PIL import Image

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench_serving import raw_round, served_measure  # noqa: E402

from devtools.bench_daemon import start_daemon, stop_tree, wait_ready  # noqa: E402
from devtools.detection_scenes import HeldOut, load_heldout  # noqa: E402
from devtools.http_endpoint import http_client  # noqa: E402
from devtools.package import pinned_package  # noqa: E402
from devtools.zoo import zoo_dir  # noqa: E402
from edgeagent.models.detection_head import DECODE_FLOOR  # noqa: E402
from edgeagent.models.detector import decode_row  # noqa: E402
from edgeagent.models.package import ModelPackage, load_package  # noqa: E402
from edgeagent.models.preprocess import prepare_image  # noqa: E402
from edgeagent.models.session import open_variant  # noqa: E402
from edgeagent.models.tasks.detection import Detections  # noqa: E402
from edgeagent.models.tasks.detection_map import mean_average_precision  # noqa: E402

BOUNDARY = "edgeagent-bench"
FRAME_SIDE = 320  # Frigate's usual detector input region


def multipart(image: bytes, min_confidence: float | None = None) -> bytes:
    """The body Frigate's plugin posts: one ``image`` file field (requests' encoding), and
    ``min_confidence`` as Home Assistant's integration adds it."""
    head = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="image"; filename="image"\r\n\r\n'
    ).encode()
    body = head + image + b"\r\n"
    if min_confidence is not None:
        field = f'Content-Disposition: form-data; name="min_confidence"\r\n\r\n{min_confidence}'
        body += f"--{BOUNDARY}\r\n{field}\r\n".encode()
    return body + f"--{BOUNDARY}--\r\n".encode()


HEADERS = {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}


def frame(scenes: HeldOut) -> bytes:
    """The first held-out scene scaled to a camera region and JPEG-encoded."""
    image = Image.fromarray(scenes.images[0]).resize((FRAME_SIDE, FRAME_SIDE))
    buffer = io.BytesIO()
    image.save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def labelled_photos(path: Path, photos: Path, package: ModelPackage) -> HeldOut:
    """Real photos and their hand-labelled boxes (``path``, a TOML of ``[[photo]]`` tables), as
    held-out scenes; each photo keeps its own size, so ``images`` is a list."""
    index = {label: i for i, label in enumerate(package.labels)}
    images, boxes, labels = [], [], []
    for photo in tomllib.loads(path.read_text(encoding="utf-8"))["photo"]:
        images.append(np.asarray(Image.open(photos / photo["file"]).convert("RGB")))
        objects = photo["objects"]
        boxes.append(np.asarray([o["box"] for o in objects], np.float32).reshape(-1, 4))
        labels.append(np.asarray([index[o["label"]] for o in objects], np.int64))
    return HeldOut(images, boxes, labels)  # type: ignore[arg-type]


def scenes_for(args, package: ModelPackage) -> HeldOut:
    if args.photos is None:
        return load_heldout(args.model)
    return labelled_photos(args.photos, args.photos_dir, package)


async def served_map(
    sock: Path, package: ModelPackage, scenes: HeldOut, min_confidence: float | None = None
) -> float:
    """mAP@0.5 of the daemon's DeepStack answers on the held-out scenes."""
    index = {label: i for i, label in enumerate(package.labels)}
    found = []
    async with http_client(sock) as client:
        for scene in range(len(scenes.images)):
            body = multipart(scenes.png(scene), min_confidence)
            async with client.post("/v1/vision/detection", data=body, headers=HEADERS) as reply:
                predictions = (await reply.json())["predictions"]
            corners = [[p[k] for k in ("x_min", "y_min", "x_max", "y_max")] for p in predictions]
            found.append(
                Detections(
                    np.asarray(corners, np.float32).reshape(-1, 4),
                    np.asarray([p["confidence"] for p in predictions], np.float32),
                    np.asarray([index[p["label"]] for p in predictions], np.int64),
                )
            )
    return mean_average_precision(found, scenes.boxes, scenes.labels, len(package.labels))


class Pipeline:
    """The daemon's per-request work in process: JPEG → letterbox → session → boxes."""

    def __init__(self, package: ModelPackage, session, image: bytes) -> None:
        self.package, self.session, self.image = package, session, image

    def run(self, _feeds: object) -> Detections:
        assert self.package.preprocess is not None
        tensor, geometry = prepare_image(self.image, self.package.preprocess)
        answer = self.session.run({self.package.inputs[0].name: tensor})
        outputs = [np.asarray(answer[spec.name])[0] for spec in self.package.outputs]
        return decode_row(self.package, outputs, geometry)


async def bench_variant(args, package: ModelPackage, runtime: str, precision: str) -> dict:
    scenes = scenes_for(args, package)
    jpeg = frame(scenes)
    assert package.preprocess is not None
    tensor, _ = prepare_image(jpeg, package.preprocess)
    feeds = {package.inputs[0].name: tensor}
    with tempfile.TemporaryDirectory(prefix="bench-detect-") as tmp:
        work = Path(tmp)
        pinned = pinned_package(args.model, precision, work / "pinned" / package.name, runtime)
        server = f'deepstack_model = "{package.name}"'
        daemon = start_daemon(pinned, work, args.threads, server=server)
        session = open_variant(package, runtime, precision, threads=args.threads or None)
        try:
            await wait_ready(daemon.sock, daemon.process)
            cells: dict[str, list[tuple[float, float]]] = {
                "raw": [],
                "pipeline": [],
                "c1": [],
                "c4": [],
            }
            whole = Pipeline(package, session, jpeg)
            for _ in range(args.rounds):
                for name, runner in (("raw", session), ("pipeline", whole)):
                    latencies, elapsed = raw_round(runner, feeds, args.seconds)
                    cells[name].append((statistics.median(latencies), len(latencies) / elapsed))
                for concurrency in (1, 4):
                    measure = served_measure(
                        daemon.sock, "/v1/vision/detection", multipart(jpeg), HEADERS, concurrency
                    )
                    served, elapsed, errors, _ = await measure(args.seconds)
                    if errors:
                        raise SystemExit(f"{runtime} {precision}: {errors} failed requests")
                    cells[f"c{concurrency}"].append(
                        (statistics.median(served), len(served) / elapsed)
                    )
            floor = None if args.photos is None else DECODE_FLOOR
            accuracy = await served_map(daemon.sock, package, scenes, floor)
        finally:
            session.close()
            stop_tree(daemon.process)
    medians = {
        name: {
            "p50_ms": round(1e3 * statistics.median(v[0] for v in values), 3),
            "req_s": round(statistics.median(v[1] for v in values), 1),
        }
        for name, values in cells.items()
    }
    return {"runtime": runtime, "precision": precision, "map50": round(accuracy, 4), **medians}


def table(rows: list[dict], args) -> str:
    lines = [
        f"Detection, {Path(args.model).name}: median of {args.rounds} alternating rounds × "
        f"{args.seconds:g} s, intra-op threads {args.threads or 'all cores'}; served = "
        "`POST /v1/vision/detection` (Unix socket, 320×320 JPEG multipart)"
        + (f"; mAP on {args.photos.name}." if args.photos else "."),
        "",
        "| variant | mAP@0.5 (served) | raw p50 ms | pipeline p50 ms | served c1 p50 ms | "
        "served/raw | c1 req/s | c4 req/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        ratio = row["c1"]["p50_ms"] / row["raw"]["p50_ms"]
        lines.append(
            f"| {row['runtime']} {row['precision']} | {row['map50']:.3f} | "
            f"{row['raw']['p50_ms']:.2f} | {row['pipeline']['p50_ms']:.2f} | "
            f"{row['c1']['p50_ms']:.2f} | {ratio:.1f}× | "
            f"{row['c1']['req_s']:.0f} | {row['c4']['req_s']:.0f} |"
        )
    return "\n".join(lines)


async def run(args) -> list[dict]:
    package = load_package(args.model)
    variants = [(v.runtime, v.precision) for v in package.variants]
    if args.only:
        variants = [v for v in variants if f"{v[0]}/{v[1]}" in args.only]
    rows = []
    for runtime, precision in variants:
        print(f"{runtime} {precision} …", file=sys.stderr, flush=True)
        try:
            rows.append(await bench_variant(args, package, runtime, precision))
        except SystemExit as exc:  # e.g. openvino/fp16 is a GPU/NPU variant: no CPU serves it
            print(f"{runtime} {precision} skipped: {exc}", file=sys.stderr, flush=True)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=zoo_dir() / "shapes_grid_mnv2")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (median)")
    parser.add_argument("--seconds", type=float, default=2.0, help="seconds per cell and round")
    parser.add_argument("--threads", type=int, default=1, help="[hardware] threads; 0 = all")
    parser.add_argument(
        "--only", action="append", metavar="RUNTIME/PRECISION", help="bench only this variant"
    )
    parser.add_argument(
        "--photos", type=Path, help="hand-labelled real photos (TOML) for the mAP, not heldout.npz"
    )
    parser.add_argument(
        "--photos-dir", type=Path, default=REPO / "third-party-models" / "photos",
        help="where the --photos files are (scripts/fetch_models.py puts them here)",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args()
    rows = asyncio.run(run(args))
    print(json.dumps(rows, indent=2) if args.json else table(rows, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
