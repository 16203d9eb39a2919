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
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from devtools.figures import add_report_arguments, report  # noqa: E402
from devtools.learning_loop import (  # noqa: E402
    BUILD_PYTHON,
    add_training_arguments,
    field_to_hub,
    png,
    thumbnails,
    train_and_sign,
)

PACKAGE = ROOT / "zoo" / "digits_mnv3"
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


def accuracy(onnx: Path, x: np.ndarray, y: np.ndarray) -> float:
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    logits = np.concatenate(
        [session.run(None, {name: x[i : i + 64]})[0] for i in range(0, len(x), 64)]
    )
    return float((logits.argmax(1) == y).mean() * 100)


async def main_async(args: argparse.Namespace) -> dict:
    work = Path(tempfile.mkdtemp(prefix="bench-learning-"))
    data = digits(work)
    rng = np.random.default_rng(0)
    order = rng.permutation(len(data["train_x"]))
    shifted_ids = set(order[: args.shifted].tolist())
    field_ids = order[args.shifted : args.shifted + args.field].tolist()
    sources = data["train_x"].copy()
    for i in shifted_ids:
        sources[i] = 255 - sources[i]
    images = [png(sources[i]) for i in [*shifted_ids, *field_ids]]
    rng.shuffle(images)

    def verdict(index: int, row: dict) -> dict | None:
        if index not in shifted_ids:
            return None  # ordinary traffic stays unreviewed: the old model teaches on it
        truth = str(int(data["train_y"][index]))
        if row["outputs"]["labels"][0] == truth:
            return {"status": "accepted"}
        return {"status": "corrected", "label": truth}

    reviewed = await field_to_hub(work, PACKAGE, "classify", images, thumbnails(sources), verdict)
    summary, seconds, out = train_and_sign(work, PACKAGE.name, PACKAGE, args.steps, args.cores)
    with np.load(PACKAGE / "heldout.npz") as held:
        old_x, old_y = held["inputs"], held["labels"]
    inverted = -old_x  # the normalised inverse: (255 - p)/255 - 0.5) / 0.5 = -x
    before = PACKAGE / "digits_mnv3.fp32.onnx"
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
    add_training_arguments(parser)
    add_report_arguments(parser)
    args = parser.parse_args()
    figures = asyncio.run(main_async(args))
    return report(figures, args)


if __name__ == "__main__":
    sys.exit(main())
