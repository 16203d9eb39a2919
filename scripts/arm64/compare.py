"""Compare two machines' answers (scripts/arm64/answers.py): same top-1, boxes within tolerance.

    compare.py REFERENCE.json OTHER.json [--iou 0.7] [--score-margin 0.05]

For every runtime × precision both machines served: each classified image must have the same
top-1 label; each detection of the reference must be matched in the other by a box of the same
label with IoU >= --iou, and the other way round, except detections within --score-margin of
the request threshold (a score of 0.249 on one CPU and 0.251 on another is the same answer).
A run one machine served and the other did not is a failure unless its runtime is not
installed on the other. Prints one line per run and a summary; exit 1 on any difference.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from known import KNOWN, known

MODELS = {"classify": "digits_mnv3", "detect": "shapes_grid_mnv2"}


def iou(a: list[float], b: list[float]) -> float:
    """Intersection over union of two corner boxes (x_min, y_min, x_max, y_max)."""
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = w * h
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def unmatched(
    mine: list[dict], theirs: list[dict], min_iou: float, floor: float
) -> tuple[list[str], float]:
    """My detections above ``floor`` with no same-label box of IoU >= min_iou in ``theirs``;
    and the worst best-IoU among the matched ones."""
    missing, worst = [], 1.0
    for found in mine:
        if found["score"] < floor:
            continue
        best = max(
            (iou(found["box"], o["box"]) for o in theirs if o["label"] == found["label"]),
            default=0.0,
        )
        if best < min_iou:
            missing.append(f"{found['label']} {found['box']} ({found['score']:.3f})")
        else:
            worst = min(worst, best)
    return missing, worst


def served_by(run: str, machine: dict) -> list[str]:
    """Answers that did not come from the run's runtime and precision (the profile allows no
    other, so this would mean the check is not testing what it says)."""
    runtime, precision = run.split(":")
    wrong = []
    for task in ("classify", "detect"):
        for name, answer in machine[task].items():
            got = (answer.get("backend"), answer.get("precision"))
            if "error" not in answer and got != (runtime, precision):
                wrong.append(f"{task} {name}: served by {got[0]}/{got[1]}, not {run}")
    return wrong


def compare_run(
    run: str, ref: dict, other: dict, min_iou: float, margin: float, threshold: float
) -> list:
    """The differences of one run, as lines; and (images checked, worst IoU) for the summary."""
    diffs: list[str] = served_by(run, ref) + served_by(run, other)
    explained: set[str] = set()

    def failed(task: str, name: str, error: str) -> None:
        why = known(run, MODELS[task], error)
        if why:
            explained.add(f"{MODELS[task]}: {why}")
        else:
            diffs.append(f"{task} {name}: {error}")

    images = scenes = 0  # compared: both machines answered
    for name, answer in ref["classify"].items():
        theirs = other["classify"].get(name, {})
        if "error" in answer or "error" in theirs:
            failed("classify", name, answer.get("error") or theirs.get("error"))
            continue
        images += 1
        if answer["labels"][0] != theirs["labels"][0]:
            diffs.append(
                f"classify {name}: top-1 {answer['labels'][0]} ({answer['scores'][0]:.3f}) vs "
                f"{theirs['labels'][0]} ({theirs['scores'][0]:.3f})"
            )
    worst = 1.0
    for name, answer in ref["detect"].items():
        theirs = other["detect"].get(name, {})
        if "error" in answer or "error" in theirs:
            failed("detect", name, answer.get("error") or theirs.get("error"))
            continue
        scenes += 1
        a, b = answer["detections"], theirs["detections"]
        floor = threshold + margin
        only_ref, w1 = unmatched(a, b, min_iou, floor)
        only_other, w2 = unmatched(b, a, min_iou, floor)
        worst = min(worst, w1, w2)
        diffs += [f"detect {name}: only in the reference: {d}" for d in only_ref]
        diffs += [f"detect {name}: only in the other: {d}" for d in only_other]
    fixed = [
        f"{model}: answers now ({why})"
        for (known_run, model), (_, why) in KNOWN.items()
        if known_run == run and not any(line.startswith(model) for line in explained)
    ]
    return [diffs, sorted(explained), fixed, images, scenes, worst]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("reference", type=Path)
    parser.add_argument("other", type=Path)
    parser.add_argument("--iou", type=float, default=0.7, help="least IoU of a matched box")
    parser.add_argument("--score-margin", type=float, default=0.05)
    parser.add_argument("--threshold", type=float, default=0.25, help="the detector's threshold")
    args = parser.parse_args()
    ref: dict[str, Any] = json.loads(args.reference.read_text())
    other: dict[str, Any] = json.loads(args.other.read_text())
    failed, compared = False, []
    print(f"reference: {ref['machine']} Python {ref['python']} {ref['runtimes']}")
    print(f"other:     {other['machine']} Python {other['python']} {other['runtimes']}")
    for run in sorted(set(ref["runs"]) | set(other["runs"])):
        a, b = ref["runs"].get(run, {}), other["runs"].get(run, {})
        if "skipped" in a or "skipped" in b:
            why = a.get("skipped") or b.get("skipped")
            print(f"{run}: not compared ({why})")
            continue
        if "error" in a or "error" in b or not a or not b:
            print(
                f"{run}: FAILED to serve: {(a.get('error') or b.get('error') or 'missing')[:600]}"
            )
            failed = True
            continue
        diffs, explained, fixed, images, scenes, worst = compare_run(
            run, a, b, args.iou, args.score_margin, args.threshold
        )
        status = "DIFFERENT" if diffs else "same, but KNOWN failures" if explained else "same"
        print(
            f"{run}: {status} ({images} images same top-1, {scenes} scenes, worst IoU {worst:.3f})"
        )
        for line in diffs:
            print(f"    {line}")
        for line in explained:
            print(f"    KNOWN: {line}")
        for line in fixed:
            print(f"    FIXED (remove it from scripts/arm64/known.py): {line}")
        failed |= bool(diffs)
        compared.append(f"{run}{' DIFFERENT' if diffs else ' KNOWN' if explained else ''}")
    print(
        f"summary: {ref['machine']} vs {other['machine']}: {len(compared)} runs compared"
        f" ({', '.join(compared)})"
    )
    return 1 if failed or not compared else 0


if __name__ == "__main__":
    sys.exit(main())
