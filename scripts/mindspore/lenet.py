"""LeNet-5 as a MindSpore ``nn.Cell``: the network the MindSpore packaging path is tested with.

``edgeagent package lenet.py:LeNet5 --weights lenet.ckpt --input-size 32,32 --channels 1``
imports this file in the MindSpore environment, builds ``LeNet5()`` and loads the checkpoint,
as it does a PyTorch ``file.py:factory`` with a state_dict.
"""

from __future__ import annotations

from mindspore import nn


class LeNet5(nn.Cell):
    """The classic 32×32 greyscale network: two conv/pool stages and three dense layers."""

    def __init__(self, classes: int = 10, channels: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, 6, 5, pad_mode="valid")
        self.conv2 = nn.Conv2d(6, 16, 5, pad_mode="valid")
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(kernel_size=2, stride=2)
        self.flatten = nn.Flatten()
        self.fc1 = nn.Dense(16 * 5 * 5, 120)
        self.fc2 = nn.Dense(120, 84)
        self.fc3 = nn.Dense(84, classes)

    def construct(self, x):
        x = self.pool(self.relu(self.conv1(x)))
        x = self.pool(self.relu(self.conv2(x)))
        x = self.flatten(x)
        x = self.relu(self.fc1(x))
        x = self.relu(self.fc2(x))
        return self.fc3(x)
