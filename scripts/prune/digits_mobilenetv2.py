"""MobileNetV2 1.0 for 32×32 greyscale digits: the network the pruning curve is measured on.

``make()`` is the ``file.py:factory`` that ``edgeagent package ... --weights w.pt`` imports
(in .venv-build, beside scripts/modelbuild): the zoo's MobileNetV2, layer for layer, with a
one-channel stem of stride 1 (a 32×32 digit has no pixels to spare for a stride-2 stem).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from modelbuild.layers import ConvBNAct
from modelbuild.mobilenetv2 import MobileNetV2

SEED = 0


def make() -> MobileNetV2:
    network = MobileNetV2(num_classes=10)
    stem = network.features[0]
    network.features[0] = ConvBNAct(1, stem[0].out_channels, stride=1)
    return network


def trained(work: Path, epochs: int, rows: int | None = None) -> Path:
    """The network trained on the digits (its state_dict, kept in ``work`` and reused when
    there) and the split written beside it as train.npz and heldout.npz (NCHW, 0..1)."""
    import torch
    from modelbuild.data import digits_split
    from modelbuild.train import train_classifier

    weights = work / "digits_mobilenetv2.pt"
    split = digits_split(32)
    if rows is not None:  # a smoke run: the first rows of each split
        split = type(split)(**{k: v[:rows] for k, v in vars(split).items()})

    def nchw(images: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray((images.astype(np.float32) / 255.0).transpose(0, 3, 1, 2))

    np.savez(work / "train.npz", inputs=nchw(split.train_images), labels=split.train_labels)
    np.savez(work / "heldout.npz", inputs=nchw(split.heldout_images), labels=split.heldout_labels)
    if weights.is_file():
        return weights
    torch.manual_seed(SEED)
    network = make()
    x = torch.from_numpy(nchw(split.train_images))
    y = torch.from_numpy(split.train_labels)
    train_classifier(network, x, y, epochs=epochs, batch_size=64, lr=3e-3, seed=SEED, max_shift=2)
    torch.save(network.state_dict(), weights)
    return weights
