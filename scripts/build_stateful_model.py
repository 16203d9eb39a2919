"""Build the zoo's streaming stateful TFLite model: state in resource variables, not tensors.

Run from the TensorFlow environment (never an agent dependency):

    .venv-tf/bin/python scripts/build_stateful_model.py --out zoo/stateful

``accumulator.tflite`` takes a window ``x [1, 4]`` and keeps a leaky sum of what it saw in a
resource variable (``VAR_HANDLE`` / ``ASSIGN_VARIABLE``): ``total = 0.5 * total + x`` and it
answers ``y = 2 * total``. Its answer to a window depends on every window before it, as a
streaming wake-word model's does, so two client streams sharing one interpreter corrupt each
other: what the agent's per-sequence serving is tested against. Written once (a few seconds);
an existing file is kept.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

NAME = "accumulator.tflite"
DECAY = 0.5
WIDTH = 4


def build(out: Path) -> Path:
    import tensorflow as tf

    class Accumulator(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.total = tf.Variable(tf.zeros([1, WIDTH]), trainable=False)

        @tf.function(input_signature=[tf.TensorSpec([1, WIDTH], tf.float32, name="x")])
        def __call__(self, x):
            self.total.assign(self.total * DECAY + x)
            return {"y": self.total * 2.0}

    module = Accumulator()
    function = module.__call__.get_concrete_function()
    converter = tf.lite.TFLiteConverter.from_concrete_functions([function], module)
    converter.experimental_enable_resource_variables = True
    out.mkdir(parents=True, exist_ok=True)
    target = out / NAME
    staged = target.with_suffix(".partial")
    staged.write_bytes(converter.convert())
    staged.replace(target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    target = args.out / NAME
    if not target.is_file():
        build(args.out)
    print(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
