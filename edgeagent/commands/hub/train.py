"""``edgeagent hub train``: a model retrained on its reviewed field samples, packaged, signed.

1. the reviewed samples of ``--model`` are split (by a hash of each sample's id, so the split
   never changes between runs) into a training set and a held-out set, and exported with the
   unreviewed ones (``hub.datasets``: class folders for a classifier, YOLO for a detector);
2. the head is fine-tuned by a Python that has torch (``--torch-python``, e.g.
   ``.venv-build/bin/python``: torch is a build-time tool, never the hub's dependency): a
   classifier's linear head (``hub.train.head``), or a grid detector's head convolutions and
   decode against the reviewed boxes (``hub.train.detector_head``, scored before and after on
   the held-out boxes);
   or, with ``--distil FILE.py:FACTORY``, a smaller student network is trained from scratch to
   answer like the package in service (``packaging.distillation``): the teacher labels the
   unreviewed samples, the reviewed ones add their labels;
3. the new network goes through ``edgeagent package``: its variants are validated against the
   held-out split (accuracy from the ImageFolder; a detector keeps its predecessor's
   ``[detection]`` head, ``--head-from``);
4. with ``--key``, ``edgeagent hub sign --canary`` makes it a signed canary release.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from edgeagent.commands.helpfmt import DefaultsFormatter
from edgeagent.commands.hub.common import emit, run
from edgeagent.commands.hub.samples import add_database_arguments, load_rows
from edgeagent.hub.keys import HubError

TRAINERS = {  # run by path with --torch-python, per task
    "classification": Path(__file__).resolve().parents[2] / "hub" / "train" / "head.py",
    "detection": Path(__file__).resolve().parents[2] / "hub" / "train" / "detector_head.py",
}
EXPORTS = {"classification": "imagefolder", "detection": "yolo"}
TORCH_PYTHON_ENV = "EDGEAGENT_TORCH_PYTHON"
MAX_ROWS = 100_000  # samples one distillation reads at most
UNLABELLED = -1  # an unreviewed sample's label: the teacher's answer is all it has


def _split_key(row: dict) -> int:
    """Where a sample falls in 0..9999: a hash of its id, so it is the same on every run."""
    digest = hashlib.sha256(f"{row['device_id']}/{row['sample_id']}".encode()).digest()
    return int.from_bytes(digest[:4], "big") % 10_000


def split_reviewed(reviewed: list[dict], percent: float) -> tuple[list[dict], list[dict]]:
    """The reviewed samples as (training, held-out): those whose key is under ``percent``.

    The line never moves, so a sample keeps its side as more are reviewed: a later run's
    held-out set was not trained on by an earlier one. With few samples the hash can leave one
    side empty (12 at 20 %: one run in 15); then the sample whose key lies nearest the line
    crosses it, so any two reviewed samples can train and be scored. That is still the same
    split on every run, and the lowest key of a growing set is a new sample or the same one.
    """
    keys = [_split_key(row) for row in reviewed]
    out = [key < percent * 100 for key in keys]
    if len(reviewed) >= 2 and len(set(out)) == 1:  # one side empty
        nearest = (max if out[0] else min)(range(len(keys)), key=keys.__getitem__)
        out[nearest] = not out[nearest]
    train = [row for row, held in zip(reviewed, out, strict=True) if not held]
    return train, [row for row, held in zip(reviewed, out, strict=True) if held]


def _next_version(version: str) -> str:
    parts = version.split(".")
    if len(parts) == 3 and all(p.isdigit() for p in parts):
        return f"{parts[0]}.{int(parts[1]) + 1}.0"
    return str(int(version) + 1) if version.isdigit() else version + ".1"


def _call(command: list[str], what: str) -> str:
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise HubError(f"{what} failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    return done.stdout


def _distil(
    args: argparse.Namespace, package: Any, work: Path, python: str, packaging: list[str]
) -> dict:
    """Package ``args.distil``'s network, trained by ``python`` (it has torch) to answer like
    ``package``, on every exported sample: the reviewed with their label, the rest with -1
    (only the teacher says what they are; their export folders hold the model's own guess).
    The package's validation report."""
    from edgeagent.packaging.images import load_samples

    shape = tuple(package.inputs[0].shape)
    rows = []
    for name in ("train", "new"):
        if (work / name).is_dir():
            found = load_samples(
                work / name, package.preprocess, "samples", MAX_ROWS, package.labels, shape
            )
            reviewed = name == "train" and found.labels is not None  # "new": folders guessed
            labels = found.labels if reviewed else np.full(len(found.inputs), UNLABELLED)
            rows.append((found.inputs, labels))
    data = work / "distil.npz"
    np.savez(
        data,
        inputs=np.concatenate([r[0] for r in rows]),
        labels=np.concatenate([r[1] for r in rows]),
    )
    channels = shape[1] if package.preprocess.layout == "NCHW" else shape[-1]
    # The folder holding edgeagent goes last on the torch Python's path: an installed hub's
    # site-packages must not shadow that Python's own numpy, onnx or torch.
    home = str(Path(__file__).resolve().parents[3])
    entry = f"import sys; sys.path.append({home!r}); from edgeagent.cli import main; "
    entry += "sys.exit(main())"
    command = [python, "-c", entry, "package", args.distil, *packaging]
    command += ["--distil-from", str(package.root), "--distil-epochs", str(args.epochs)]
    command += ["--calibration", str(data), "--channels", str(channels)]
    command += ["--max-images", str(MAX_ROWS)]
    return json.loads(_call(command, "distillation"))


def add_train(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "train",
        formatter_class=DefaultsFormatter,
        help="fine-tune a classifier or detector on its reviewed field samples, package, sign",
        description=(
            "Split --model's reviewed samples into training and held-out sets, fine-tune the "
            "head of --package on them (the old head teaches on the unreviewed ones, so the "
            "model keeps what it knew), package the result with edgeagent package validated "
            "on the held-out split, and with --key sign it as a canary release."
        ),
    )
    add_database_arguments(parser)
    parser.add_argument("--package", type=Path, required=True, help="the package in service")
    parser.add_argument("--out", type=Path, required=True, help="the new package directory")
    parser.add_argument("--new-version", help="its version (default: the next minor)")
    parser.add_argument("--heldout-percent", type=float, default=20.0, help="of reviewed samples")
    parser.add_argument("--steps", type=int, default=300, help="optimiser steps on the head")
    parser.add_argument(
        "--distil",
        metavar="FILE.py:FACTORY",
        help="train this smaller network to answer like --package (knowledge distillation) "
        "instead of fine-tuning --package's head",
    )
    parser.add_argument("--epochs", type=int, default=30, help="with --distil: training epochs")
    parser.add_argument(
        "--variants", default="graph,int8", help="edgeagent package --variants of the result"
    )
    parser.add_argument(
        "--torch-python",
        help=f"a Python with torch, onnx and onnxruntime (unset: ${TORCH_PYTHON_ENV}, else the "
        "Python running this command)",
    )
    parser.add_argument("--key", type=Path, action="append", help="release key: sign a canary")
    parser.add_argument("--base-url", help="with --key: where the artifact will be served")
    parser.add_argument("--release-out", type=Path, help="with --key: artifact directory")
    parser.add_argument("--canary", default="share=0.1", help="with --key: the canary policy")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")

    async def work(args: argparse.Namespace) -> int:
        summary = await train(args)
        emit(args, summary, f"trained {summary['package']}: {json.dumps(summary['training'])}")
        return 0

    parser.set_defaults(handler=lambda args: run(args, work))


async def train(args: argparse.Namespace) -> dict:
    from edgeagent.hub.blobs import BlobError
    from edgeagent.hub.datasets.export import ExportError, export
    from edgeagent.models.package import PackageError, load_package

    try:
        package = load_package(args.package)
    except PackageError as exc:
        raise HubError(str(exc)) from exc
    if package.preprocess is None or package.task not in TRAINERS:
        raise HubError(f"{package.name}: hub train fine-tunes image classifiers and detectors")
    if args.distil and package.task != "classification":
        raise HubError(f"{package.name}: --distil trains classifiers; a detector's head is tuned")
    if args.out.exists():
        raise HubError(f"{args.out} exists: name a new package directory")
    if not 0 < args.heldout_percent < 100:
        raise HubError(f"--heldout-percent {args.heldout_percent}: a share between 0 and 100")
    rows, blobs = await load_rows(args)
    reviewed = [r for r in rows if r["status"] in ("accepted", "corrected")]
    fresh = [r for r in rows if r["status"] == "new"]
    train_rows, heldout_rows = split_reviewed(reviewed, args.heldout_percent)
    if not train_rows or not heldout_rows:
        raise HubError(
            f"{len(reviewed)} reviewed samples of {args.model}: too few for a training and a "
            "held-out set; review more on the dashboard"
        )
    work = args.out.with_name(f".{args.out.name}.work")
    labels = list(package.labels)
    try:
        for name, chosen in (("train", train_rows), ("heldout", heldout_rows), ("new", fresh)):
            if chosen:
                export(chosen, blobs, work / name, EXPORTS[package.task], classes=labels)
    except (ExportError, BlobError) as exc:  # a row naming an image the store lost, or is down
        raise HubError(str(exc)) from exc
    python = args.torch_python or os.environ.get(TORCH_PYTHON_ENV) or sys.executable
    (work / "labels.txt").write_text("\n".join(labels) + "\n", encoding="utf-8")
    spec = package.preprocess
    version = args.new_version or _next_version(package.version)
    packaging = ["--out", str(args.out), "--name", package.name, "--version", version]
    packaging += ["--labels", str(work / "labels.txt")]
    packaging += ["--input-size", f"{spec.size[0]},{spec.size[1]}"]
    packaging += ["--scale", repr(spec.scale), "--mean", ",".join(map(repr, spec.mean))]
    packaging += ["--std", ",".join(map(repr, spec.std)), "--variants", args.variants, "--json"]
    images = "images" if package.task == "detection" else ""  # a YOLO set's, or class folders
    packaging += ["--heldout", str(work / "heldout" / images)]
    if args.distil:
        training: dict = {"distil": args.distil, "epochs": args.epochs}
        report = _distil(args, package, work, python, packaging)
        training["distillation"] = report.get("distillation")
    else:
        onnx = work / f"{package.name}.onnx"
        trainer = TRAINERS[package.task]
        command = [python, str(trainer), str(package.root), "--train", str(work / "train")]
        if package.task == "detection":  # scored before and after against the reviewed boxes
            command += ["--heldout", str(work / "heldout")]
            packaging += ["--task", "detection", "--head-from", str(package.root)]
        if fresh:
            command += ["--unlabelled", str(work / "new")]
        training = json.loads(
            _call([*command, "--out", str(onnx), "--steps", str(args.steps)], "training")
        )
        packaging += ["--calibration", str(work / "train" / images)]
        command = [sys.executable, "-m", "edgeagent.cli", "package", str(onnx), *packaging]
        report = json.loads(_call(command, "edgeagent package"))
    summary = {
        "package": str(args.out),
        "version": version,
        "train": len(train_rows),
        "heldout": len(heldout_rows),
        "unreviewed": len(fresh),
        "training": training,
        "validation": report,
    }
    if args.key:
        if not args.base_url:
            raise HubError("--key needs --base-url (where the artifact will be served)")
        sign = [sys.executable, "-m", "edgeagent.cli", "hub", "sign", str(args.out)]
        for key in args.key:
            sign += ["--key", str(key)]
        sign += ["--base-url", args.base_url, "--out", str(args.release_out or args.out.parent)]
        sign += ["--canary", args.canary, "--json"]
        summary["release"] = json.loads(_call(sign, "edgeagent hub sign"))
    return summary
