"""Building blocks shared by the MobileNet-family networks (plain torch, no torchvision)."""

from __future__ import annotations

from torch import nn


def make_divisible(value: float, divisor: int = 8) -> int:
    """Round a channel count to a multiple of ``divisor`` without dropping more than 10 %.

    The reference MobileNet implementations do this so width multipliers keep channel counts
    friendly to vectorised kernels; the rule must match theirs for the layer shapes to match.
    """
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    if rounded < 0.9 * value:
        rounded += divisor
    return rounded


class ConvBNAct(nn.Sequential):
    """Conv2d (no bias) → BatchNorm → optional activation, with 'same' padding for odd kernels."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel: int = 3,
        stride: int = 1,
        groups: int = 1,
        act: type[nn.Module] | None = nn.ReLU6,
    ) -> None:
        layers: list[nn.Module] = [
            nn.Conv2d(
                in_channels,
                out_channels,
                kernel,
                stride,
                padding=kernel // 2,
                groups=groups,
                bias=False,
            ),
            nn.BatchNorm2d(out_channels),
        ]
        if act is not None:
            layers.append(act())
        super().__init__(*layers)


def init_weights(model: nn.Module) -> None:
    """Initialise like the reference implementations (Kaiming fan-out convs, small linear)."""
    for module in model.modules():
        if isinstance(module, nn.Conv2d):
            nn.init.kaiming_normal_(module.weight, mode="fan_out")
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, (nn.BatchNorm2d, nn.LayerNorm)):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, 0, 0.01)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
