"""The zoo's digits split as one .npz, for trainers outside the build environment (MindSpore).

    .venv-build/bin/python scripts/modelbuild/digits_npz.py --size 32 --out digits.npz

Pixels scaled to 0..1, NCHW float32; the same stratified held-out split as the zoo's digits
classifier (``modelbuild.data.digits_split``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from modelbuild.data import digits_split


def nchw(images: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray((images.astype(np.float32) / 255.0).transpose(0, 3, 1, 2))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=32)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    split = digits_split(args.size)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(
        args.out,
        train_inputs=nchw(split.train_images),
        train_labels=split.train_labels,
        heldout_inputs=nchw(split.heldout_images),
        heldout_labels=split.heldout_labels,
    )
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
