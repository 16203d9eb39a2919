#!/usr/bin/env python3
"""The prune-ratio curve of a MobileNetV2 on the digits data: top-1 and speed per ratio.

Trains MobileNetV2 1.0 (scripts/prune/digits_mobilenetv2.py) on the zoo's digits split (cached
in --work), then runs ``edgeagent package file.py:make --prune R1,R2,… --prune-epochs N`` once:
each ratio's channels are removed with torch-pruning, the network fine-tuned on the training
split (``--calibration``, never the held-out rows), its top-1 measured on the held-out split
and its batch-1 latency against the unpruned network's on this CPU (medians of alternating
rounds, packaging.pruning.speedup). Prints the curve as JSON and a Markdown table; the package
holds the largest ratio that passed (within --max-top1-drop points, ≥ 1.05× faster).

    .venv-build/bin/python scripts/bench_prune.py --work bench-out/prune [--ratios 0.2,0.3,0.5]

Run from .venv-build (torch, torch-pruning), with the checkout on PYTHONPATH.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "scripts"), str(REPO / "scripts" / "prune")]

EPOCHS = 12


from digits_mobilenetv2 import trained  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--ratios", default="0.2,0.3,0.4,0.5,0.6,0.7")
    parser.add_argument("--epochs", type=int, default=EPOCHS, help="training epochs")
    parser.add_argument("--prune-epochs", type=int, default=8, help="fine-tuning epochs")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads when timing")
    parser.add_argument("--rows", type=int, help="only the first rows of each split (a smoke run)")
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    weights = trained(args.work, args.epochs, args.rows)
    from edgeagent.packaging.build import build_package
    from edgeagent.packaging.options import PackageOptions

    out = args.work / "package"
    shutil.rmtree(out, ignore_errors=True)
    labels = args.work / "digits.txt"
    labels.write_text("".join(f"{d}\n" for d in range(10)))
    options = PackageOptions(
        name="digits_mobilenetv2",
        input_size=(32, 32),
        channels=1,
        labels=labels,
        weights=weights,
        prune=tuple(float(r) for r in args.ratios.split(",")),
        prune_epochs=args.prune_epochs,
        calibration=args.work / "train.npz",
        heldout=args.work / "heldout.npz",
        variants=("graph",),
        max_images=2000,
        threads=args.threads,
    )
    build_package(
        [f"{REPO / 'scripts' / 'prune' / 'digits_mobilenetv2.py'}:make"],
        out,
        options,
        lambda line: print(f"bench_prune: {line}", file=sys.stderr, flush=True),
    )
    report = json.loads((out / "validation.json").read_text())
    variants = report["variants"]
    print(json.dumps({"pruning": report["pruning"], "variants": variants}, indent=2))
    base = report["pruning"][0]["unpruned_accuracy"]
    print(f"\nunpruned top-1 {base:.2f} %")
    print("| ratio | parameters | top-1 % | agreement % | speed-up | kept |")
    print("|---|---|---|---|---|---|")
    for row in report["pruning"]:
        print(
            f"| {row['ratio']:g} | {row['parameters']:,} | {row['accuracy']:.2f} | "
            f"{row['agreement']:.2f} | {row['speedup']:.2f}x | {'yes' if row['kept'] else '—'} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
