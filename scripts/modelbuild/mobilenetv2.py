"""MobileNetV2 1.0 (Sandler et al. 2018), layer for layer as in the torchvision reference."""

from __future__ import annotations

import torch
from torch import nn

from modelbuild.layers import ConvBNAct, init_weights, make_divisible

# t (expansion), c (output channels), n (repeats), s (first stride) — Table 2 of the paper.
SETTINGS = (
    (1, 16, 1, 1),
    (6, 24, 2, 2),
    (6, 32, 3, 2),
    (6, 64, 4, 2),
    (6, 96, 3, 1),
    (6, 160, 3, 2),
    (6, 320, 1, 1),
)


class InvertedResidual(nn.Module):
    """Expand (1×1) → depthwise 3×3 → linear projection, with a skip when shapes allow."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        stride: int,
        expansion: int,
        act: type[nn.Module] = nn.ReLU6,
    ) -> None:
        super().__init__()
        hidden = in_channels * expansion
        layers: list[nn.Module] = []
        if expansion != 1:
            layers.append(ConvBNAct(in_channels, hidden, kernel=1, act=act))
        layers += [
            ConvBNAct(hidden, hidden, stride=stride, groups=hidden, act=act),
            ConvBNAct(hidden, out_channels, kernel=1, act=None),
        ]
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and in_channels == out_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x)
        return x + out if self.residual else out


class MobileNetV2(nn.Module):
    def __init__(self, num_classes: int = 1000, width: float = 1.0) -> None:
        super().__init__()
        channels = make_divisible(32 * width)
        last = make_divisible(1280 * max(1.0, width))
        layers: list[nn.Module] = [ConvBNAct(3, channels, stride=2)]
        for expansion, out, repeats, stride in SETTINGS:
            out_channels = make_divisible(out * width)
            for index in range(repeats):
                layers.append(
                    InvertedResidual(channels, out_channels, stride if index == 0 else 1, expansion)
                )
                channels = out_channels
        layers.append(ConvBNAct(channels, last, kernel=1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(last, num_classes))
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        x = x.mean(dim=(2, 3))
        return self.classifier(x)
