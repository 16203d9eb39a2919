"""MobileViT-XXS (Mehta & Rastegari 2022), following Apple's reference configuration.

Attention is written out with matmul/softmax and patches are unfolded with reshape/permute
rather than ``nn.MultiheadAttention``/``F.unfold`` so the graph converts cleanly to ONNX,
TFLite and OpenVINO and quantizes op by op.
"""

from __future__ import annotations

import torch
from torch import nn

from modelbuild.layers import ConvBNAct, init_weights
from modelbuild.mobilenetv2 import InvertedResidual

PATCH = 2  # patch height = width
HEADS = 4
EXPANSION = 2  # MV2 expansion in the XXS model


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens, dim = x.shape[1], x.shape[2]
        qkv = self.qkv(x).reshape(-1, tokens, 3, self.heads, self.head_dim)
        qkv = qkv.permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        weights = torch.softmax((q * self.head_dim**-0.5) @ k.transpose(-2, -1), dim=-1)
        out = (weights @ v).transpose(1, 2).reshape(-1, tokens, dim)
        return self.proj(out)


class TransformerLayer(nn.Module):
    """Pre-norm transformer encoder layer with a SiLU MLP of twice the width."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, HEADS)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, dim * 2), nn.SiLU(), nn.Linear(dim * 2, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class MobileViTBlock(nn.Module):
    """Local 3×3 conv → unfold 2×2 patches → transformer over patches → fold → fuse with input."""

    def __init__(self, channels: int, dim: int, depth: int) -> None:
        super().__init__()
        self.local = nn.Sequential(
            ConvBNAct(channels, channels, act=nn.SiLU),
            nn.Conv2d(channels, dim, 1, bias=False),
        )
        self.transformer = nn.Sequential(*(TransformerLayer(dim) for _ in range(depth)))
        self.norm = nn.LayerNorm(dim)
        self.project = ConvBNAct(dim, channels, kernel=1, act=nn.SiLU)
        self.fuse = ConvBNAct(2 * channels, channels, act=nn.SiLU)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.local(x)
        dim, height, width = y.shape[1], y.shape[2], y.shape[3]
        rows, cols = height // PATCH, width // PATCH
        # (B, D, H, W) → (B·P·P, rows·cols, D): one sequence per pixel position inside a patch.
        y = y.reshape(-1, dim, rows, PATCH, cols, PATCH).permute(0, 3, 5, 2, 4, 1)
        y = y.reshape(-1, rows * cols, dim)
        y = self.norm(self.transformer(y))
        y = y.reshape(-1, PATCH, PATCH, rows, cols, dim).permute(0, 5, 3, 1, 4, 2)
        y = self.project(y.reshape(-1, dim, height, width))
        return self.fuse(torch.cat((x, y), dim=1))


class MobileViTXXS(nn.Module):
    """Input 256×256 (all feature maps stay divisible by the 2×2 patch)."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.stem = ConvBNAct(3, 16, stride=2, act=nn.SiLU)
        self.stages = nn.Sequential(
            InvertedResidual(16, 16, 1, EXPANSION, nn.SiLU),
            nn.Sequential(
                InvertedResidual(16, 24, 2, EXPANSION, nn.SiLU),
                InvertedResidual(24, 24, 1, EXPANSION, nn.SiLU),
                InvertedResidual(24, 24, 1, EXPANSION, nn.SiLU),
            ),
            nn.Sequential(
                InvertedResidual(24, 48, 2, EXPANSION, nn.SiLU), MobileViTBlock(48, 64, 2)
            ),
            nn.Sequential(
                InvertedResidual(48, 64, 2, EXPANSION, nn.SiLU), MobileViTBlock(64, 80, 4)
            ),
            nn.Sequential(
                InvertedResidual(64, 80, 2, EXPANSION, nn.SiLU), MobileViTBlock(80, 96, 3)
            ),
        )
        self.head = ConvBNAct(80, 320, kernel=1, act=nn.SiLU)
        self.classifier = nn.Sequential(nn.Dropout(0.1), nn.Linear(320, num_classes))
        init_weights(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.head(self.stages(self.stem(x)))
        return self.classifier(x.mean(dim=(2, 3)))
