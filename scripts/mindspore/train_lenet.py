"""Train the zoo's MindSpore LeNet-5 on the digits data (run in .venv-ms, a few seconds).

    .venv-ms/bin/python scripts/mindspore/train_lenet.py --data DIGITS.npz --out zoo/lenet_mindspore

``DIGITS.npz`` is the zoo's digits split (scripts/modelbuild/digits_npz.py writes it from the
build environment, which has scikit-learn): 32×32 greyscale pixels scaled to 0..1, NCHW. Writes
``lenet.ckpt`` (MindSpore's checkpoint), ``heldout.npz`` (the held-out inputs and labels) and
``mindspore_outputs.npz`` (MindSpore's own logits for them: what served answers are held to).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

EPOCHS = 8
BATCH = 32
SEED = 0


def train(data: Path, out: Path) -> dict:
    import mindspore as ms
    from mindspore import nn

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from lenet import LeNet5

    ms.set_seed(SEED)
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    with np.load(data) as split:
        train_x, train_y = split["train_inputs"], split["train_labels"].astype(np.int32)
        held_x, held_y = split["heldout_inputs"], split["heldout_labels"]
    net = LeNet5()
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    optimizer = nn.Adam(net.trainable_params(), learning_rate=2e-3)
    step = nn.TrainOneStepCell(nn.WithLossCell(net, loss), optimizer)
    step.set_train()
    rng = np.random.default_rng(SEED)
    for _ in range(EPOCHS):
        order = rng.permutation(len(train_x))
        for start in range(0, len(order), BATCH):
            rows = order[start : start + BATCH]
            step(ms.Tensor(train_x[rows]), ms.Tensor(train_y[rows]))
    net.set_train(False)
    logits = net(ms.Tensor(held_x)).asnumpy()
    accuracy = float(np.mean(logits.argmax(1) == held_y))
    out.mkdir(parents=True, exist_ok=True)
    ms.save_checkpoint(net, str(out / "lenet.ckpt"))
    np.savez(out / "heldout.npz", inputs=held_x, labels=held_y)
    np.savez(out / "mindspore_outputs.npz", logits=logits)
    figures = {"heldout_accuracy": round(accuracy, 4), "epochs": EPOCHS}
    (out / "build.json").write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    print(json.dumps(train(args.data, args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
