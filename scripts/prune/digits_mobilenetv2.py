"""MobileNetV2 1.0 for 32×32 greyscale digits: the network the pruning curve is measured on.

``make()`` is the ``file.py:factory`` that ``edgeagent package ... --weights w.pt`` imports
(in .venv-build, beside scripts/modelbuild): the zoo's MobileNetV2, layer for layer, with a
one-channel stem of stride 1 (a 32×32 digit has no pixels to spare for a stride-2 stem).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from modelbuild.layers import ConvBNAct
from modelbuild.mobilenetv2 import MobileNetV2


def make() -> MobileNetV2:
    network = MobileNetV2(num_classes=10)
    stem = network.features[0]
    network.features[0] = ConvBNAct(1, stem[0].out_channels, stride=1)
    return network
