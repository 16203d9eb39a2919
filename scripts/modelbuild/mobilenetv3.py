"""MobileNetV3-Small (Howard et al. 2019), as in the torchvision reference, plus a scaled-down
configuration of the same design for small inputs (the digits classifier)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from modelbuild.layers import ConvBNAct, init_weights, make_divisible


@dataclass(frozen=True)
class Bneck:
    """One bottleneck row of Table 2: kernel, expansion and output channels, SE, h-swish, stride."""

    kernel: int
    expanded: int
    out: int
    se: bool
    hswish: bool
    stride: int


# MobileNetV3-Small, Table 2 of the paper (input 16 channels after the stem).
SMALL = (
    Bneck(3, 16, 16, True, False, 2),
    Bneck(3, 72, 24, False, False, 2),
    Bneck(3, 88, 24, False, False, 1),
    Bneck(5, 96, 40, True, True, 2),
    Bneck(5, 240, 40, True, True, 1),
    Bneck(5, 240, 40, True, True, 1),
    Bneck(5, 120, 48, True, True, 1),
    Bneck(5, 144, 48, True, True, 1),
    Bneck(5, 288, 96, True, True, 2),
    Bneck(5, 576, 96, True, True, 1),
    Bneck(5, 576, 96, True, True, 1),
)


class SqueezeExcite(nn.Module):
    """Channel attention: global pool → 1×1 reduce (ReLU) → 1×1 expand (hard-sigmoid) → scale."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        squeezed = make_divisible(channels // 4)
        self.reduce = nn.Conv2d(channels, squeezed, 1)
        self.expand = nn.Conv2d(squeezed, channels, 1)
        self.relu = nn.ReLU()
        self.gate = nn.Hardsigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = x.mean(dim=(2, 3), keepdim=True)
        scale = self.gate(self.expand(self.relu(self.reduce(scale))))
        return x * scale


class Bottleneck(nn.Module):
    def __init__(self, in_channels: int, cfg: Bneck, width: float) -> None:
        super().__init__()
        expanded = make_divisible(cfg.expanded * width)
        out = make_divisible(cfg.out * width)
        act = nn.Hardswish if cfg.hswish else nn.ReLU
        layers: list[nn.Module] = []
        if expanded != in_channels:
            layers.append(ConvBNAct(in_channels, expanded, kernel=1, act=act))
        layers.append(
            ConvBNAct(expanded, expanded, cfg.kernel, cfg.stride, groups=expanded, act=act)
        )
        if cfg.se:
            layers.append(SqueezeExcite(expanded))
        layers.append(ConvBNAct(expanded, out, kernel=1, act=None))
        self.block = nn.Sequential(*layers)
        self.out_channels = out
        self.residual = cfg.stride == 1 and in_channels == out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.block(x)
        return x + out if self.residual else out


class MobileNetV3Small(nn.Module):
    """The reference network by default; ``width``, ``in_channels``, ``stem_stride`` and
    ``hidden`` shrink it for tiny inputs such as 32×32 digits without changing its design."""

    def __init__(
        self,
        num_classes: int = 1000,
        width: float = 1.0,
        in_channels: int = 3,
        stem_stride: int = 2,
        hidden: int = 1024,
        dropout: float = 0.2,
    ) -> None:
        super().__init__()
        channels = make_divisible(16 * width)
        layers: list[nn.Module] = [
            ConvBNAct(in_channels, channels, stride=stem_stride, act=nn.Hardswish)
        ]
        for cfg in SMALL:
            block = Bottleneck(channels, cfg, width)
            layers.append(block)
            channels = block.out_channels
        last = make_divisible(576 * width)
        layers.append(ConvBNAct(channels, last, kernel=1, act=nn.Hardswish))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(
            nn.Linear(last, hidden),
            nn.Hardswish(),
            nn.Dropout(dropout),
            nn.Linear(hidden, num_classes),
        )
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        x = x.mean(dim=(2, 3))
        return self.classifier(x)
