#!/usr/bin/env python3
"""Distillation on the digits: a MobileNetV3-Small student of a MobileNetV2 teacher package.

1. MobileNetV2 1.0 (scripts/prune/digits_mobilenetv2.py) is trained on the zoo's digits
   training split (cached in --work) and packaged: the teacher;
2. ``edgeagent package scripts/distil/digits_mobilenetv3_small.py:make --distil-from TEACHER``
   trains MobileNetV3-Small 1.0 from scratch on the same training images, their labels
   withheld unless --labelled: the teacher package's softened outputs (onnxruntime) are all
   it learns from, as the hub's unreviewed field samples would be;
3. both are judged on the held-out split, and the student's batch-1 latency is set against
   the teacher's fp32 ONNX here (medians of alternating rounds, ``--threads`` intra-op).

Goal (issue 36): the student within 2 points of the teacher's top-1, ≥ 1.5× faster.

    .venv-build/bin/python scripts/bench_distil.py --work bench-out/distil [--epochs 40]

Run from .venv-build (torch), with the checkout on PYTHONPATH; prints JSON and a table.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "scripts"), str(REPO / "scripts" / "prune")]

from digits_mobilenetv2 import trained  # noqa: E402

TEACHER = REPO / "scripts" / "prune" / "digits_mobilenetv2.py"
STUDENT = REPO / "scripts" / "distil" / "digits_mobilenetv3_small.py"


def package(source: str, out: Path, extra: dict, log: str) -> dict:
    """``edgeagent package source`` in this process; its validation.json."""
    from edgeagent.packaging.build import build_package
    from edgeagent.packaging.options import PackageOptions

    shutil.rmtree(out, ignore_errors=True)
    options = PackageOptions(
        input_size=(32, 32),
        channels=1,
        mean=(0.0,),
        std=(1.0,),
        variants=("graph",),
        max_images=100_000,
        **extra,
    )
    build_package([source], out, options, lambda line: print(f"{log}: {line}", file=sys.stderr))
    return json.loads((out / "validation.json").read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--teacher-epochs", type=int, default=12)
    parser.add_argument("--epochs", type=int, default=40, help="the student's")
    parser.add_argument("--labelled", action="store_true", help="give the student the labels too")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads when timing")
    parser.add_argument("--rows", type=int, help="only the first rows of each split (a smoke run)")
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    weights = trained(args.work, args.teacher_epochs, args.rows)
    labels = args.work / "digits.txt"
    labels.write_text("".join(f"{d}\n" for d in range(10)))
    heldout = args.work / "heldout.npz"
    common = {"labels": labels, "heldout": heldout, "threads": args.threads}
    teacher = args.work / "teacher"
    package(
        f"{TEACHER}:make",
        teacher,
        {"name": "digits_mobilenetv2", "weights": weights, **common},
        "teacher",
    )
    calibration = args.work / "train.npz"
    if not args.labelled:
        with np.load(calibration) as data:
            inputs = data["inputs"]
        calibration = args.work / "train-unlabelled.npz"
        np.savez(calibration, inputs=inputs, labels=np.full(len(inputs), -1, np.int64))
    started = time.perf_counter()
    report = package(
        f"{STUDENT}:make",
        args.work / "student",
        {
            "name": "digits_mnv3_small_student",
            "distil_from": teacher,
            "distil_epochs": args.epochs,
            "calibration": calibration,
            **common,
        },
        "student",
    )
    figures = report["distillation"]
    summary = {
        **figures,
        "threads": args.threads,
        "top1_gap_points": round(figures["teacher_accuracy"] - figures["accuracy"], 2),
        "distil_package_s": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(summary, indent=2))
    print("\n| network | parameters | top-1 % | speed |")
    print("|---|---|---|---|")
    print(f"| MobileNetV2 1.0 (teacher) | — | {figures['teacher_accuracy']:.2f} | 1.00x |")
    print(
        f"| MobileNetV3-Small 1.0 (student) | {figures['parameters']:,} | "
        f"{figures['accuracy']:.2f} | {figures['speedup']:.2f}x |"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
