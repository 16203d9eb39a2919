"""A small convolutional student for distillation tests: 32×32 grey digits, ten classes.

Small enough that a few epochs on the CPU teach it in seconds (``.venv-build`` imports it
through ``edgeagent package tests/support/tiny_student.py:make --distil-from …``).
"""

from __future__ import annotations

import torch
from torch import nn


def make() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, 10),
    )
