"""An anchor-free single-stride grid detector on a width-reduced MobileNetV2 backbone.

MobileNetV2 (width 0.5) features to stride 16, added (upsampled) into the stride-8 features — a
one-level FPN, so each stride-8 cell sees the whole of a large object — then a separable head
that predicts per cell four box numbers and one score per class (YOLOv8/FCOS-style, no anchors,
no objectness).

The grid decode is part of the graph: ``forward`` returns ``[N, cells, 4 + C]`` rows of
centre-x, centre-y, width, height (normalised to the input) and sigmoid class scores, which the
agent's YOLO-style decoder and NMS read as they are (``[detection] style = "yolo"``,
``normalized = true``). Every column is a sigmoid times a constant plus a constant, so the whole
output lies in about 0..1: one INT8 scale suits boxes and scores alike, and the decode costs one
multiply-add that every runtime quantizes.
"""

from __future__ import annotations

import torch
from torch import nn

from modelbuild.layers import ConvBNAct, init_weights, make_divisible
from modelbuild.mobilenetv2 import SETTINGS, InvertedResidual

STRIDE = 8
CENTRE_REACH = 1.0  # a cell's box centre may lie up to one cell outside it (3×3 positives)
NECK_CHANNELS = 48
PRIOR_SCORE = 0.01  # class scores start low, as in RetinaNet: most cells hold nothing


def grid_decode(size: int, classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The per-column scale and per-cell offset that turn sigmoids into output rows.

    Centre: ``(cell + (1 + 2·reach)·s - reach) / cells``, so a cell reaches ``reach`` cells
    beyond its own edges; width and height: the sigmoid itself, a fraction of the input; class
    scores: the sigmoid.
    """
    cells = size // STRIDE
    scale = torch.ones(4 + classes)
    scale[:2] = (1 + 2 * CENTRE_REACH) / cells
    offset = torch.zeros(4 + classes, cells, cells)
    index = torch.arange(cells, dtype=torch.float32)
    offset[0] = ((index - CENTRE_REACH) / cells)[None, :]
    offset[1] = ((index - CENTRE_REACH) / cells)[:, None]
    return scale[None, :, None, None], offset[None]


class _Separable(nn.Sequential):
    """Depthwise 3×3 then pointwise 1×1 (SSDLite's cheap prediction layer)."""

    def __init__(self, channels: int, out_channels: int) -> None:
        super().__init__(
            ConvBNAct(channels, channels, groups=channels),
            ConvBNAct(channels, out_channels, kernel=1),
        )


class GridDetector(nn.Module):
    """MobileNetV2-0.5 to stride 16, one-level FPN to stride 8, grid head with in-graph decode."""

    def __init__(self, classes: int, size: int, width: float = 0.5) -> None:
        super().__init__()
        self.classes = classes
        channels = make_divisible(32 * width)
        stages: list[nn.Module] = [ConvBNAct(3, channels, stride=2)]
        stride_8: list[nn.Module] = []
        for expansion, out, repeats, stride in SETTINGS[:5]:  # blocks up to stride 16
            out_channels = make_divisible(out * width)
            for index in range(repeats):
                stages.append(
                    InvertedResidual(channels, out_channels, stride if index == 0 else 1, expansion)
                )
                channels = out_channels
            if out == 32:  # the last stride-8 block
                stride_8, stages = stages, []
                fine = channels
        self.stride_8 = nn.Sequential(*stride_8)
        self.stride_16 = nn.Sequential(*stages)
        self.lateral_fine = ConvBNAct(fine, NECK_CHANNELS, kernel=1, act=None)
        self.lateral_coarse = ConvBNAct(channels, NECK_CHANNELS, kernel=1, act=None)
        self.head = nn.Sequential(
            _Separable(NECK_CHANNELS, NECK_CHANNELS), _Separable(NECK_CHANNELS, NECK_CHANNELS)
        )
        self.predict = nn.Conv2d(NECK_CHANNELS, 4 + classes, 1)
        init_weights(self)
        with torch.no_grad():
            self.predict.weight.mul_(0.1)
            self.predict.bias.zero_()
            self.predict.bias[4:] = -torch.log(torch.tensor((1 - PRIOR_SCORE) / PRIOR_SCORE))
        scale, offset = grid_decode(size, classes)
        self.register_buffer("scale", scale)
        self.register_buffer("offset", offset)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """The raw ``[N, 4 + C, cells, cells]`` map before the sigmoid (what training reads)."""
        fine = self.stride_8(x)
        coarse = self.stride_16(fine)
        # Upsampled to the fine map's size, not by a scale factor: the exported Resize then has
        # constant output sizes, which onnxruntime's symbolic shape inference (run before INT8
        # quantization, to fold BatchNorm) can follow; with scales it gave up.
        upsampled = nn.functional.interpolate(
            self.lateral_coarse(coarse), size=fine.shape[-2:], mode="nearest"
        )
        merged = self.lateral_fine(fine) + upsampled
        return self.predict(self.head(merged))

    def decode(self, logits: torch.Tensor) -> torch.Tensor:
        """``[N, 4 + C, cells, cells]`` logits → ``[N, cells², 4 + C]`` output rows."""
        rows = torch.sigmoid(logits) * self.scale + self.offset
        return rows.flatten(2).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decode(self.logits(x))
