"""What each zoo package is: network, input geometry, preprocessing, labels, serving hints.

Importing this module does not import torch (the networks are imported when built), so the
build's parent process can check caches and parse arguments without it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from modelbuild.labels import SHAPES, digit_labels, imagenet_labels, shape_labels

if TYPE_CHECKING:
    from torch import nn

FORMATS = ("onnx", "tflite", "openvino")  # onnx always: it is the FP32 reference
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def mobilenet_v2() -> nn.Module:
    from modelbuild.mobilenetv2 import MobileNetV2

    return MobileNetV2()


def mobilenet_v3_small() -> nn.Module:
    from modelbuild.mobilenetv3 import MobileNetV3Small

    return MobileNetV3Small()


def mobilevit_xxs() -> nn.Module:
    from modelbuild.mobilevit import MobileViTXXS

    return MobileViTXXS()


def digits_mnv3() -> nn.Module:
    """MobileNetV3-Small's design for 32×32 grey digits: half width, no stem stride."""
    from modelbuild.mobilenetv3 import MobileNetV3Small

    return MobileNetV3Small(
        num_classes=10, width=0.5, in_channels=1, stem_stride=1, hidden=256, dropout=0.1
    )


DETECTOR_SIZE = 96


def shapes_grid_mnv2() -> nn.Module:
    """The grid detector (MobileNetV2-0.5 backbone) for the synthetic shape scenes."""
    from modelbuild.detector import GridDetector

    return GridDetector(len(SHAPES), DETECTOR_SIZE)


@dataclass(frozen=True)
class ModelSpec:
    name: str
    description: str
    network: Callable[[], nn.Module]
    labels: Callable[[], list[str]]
    size: int  # square input, pixels
    resize: int | None  # shorter side before the centre crop; None = straight to size
    color: str  # RGB or L
    mean: tuple[float, ...]
    std: tuple[float, ...]
    trained: bool  # True: trained on real data here; False: seeded weights, BN re-estimated
    max_batch_size: int = 8
    max_queue_delay_ms: float = 2.0
    version: str = "1.0.0"
    task: str = "classification"
    letterbox: bool = False
    detection: Mapping[str, object] | None = None  # the [detection] table of a detector

    @property
    def channels(self) -> int:
        return 1 if self.color == "L" else 3

    @property
    def output_name(self) -> str:
        return "detections" if self.task == "detection" else "logits"


def imagenet_224(name: str, description: str, network: Callable[[], nn.Module]) -> ModelSpec:
    """The torchvision-style ImageNet input: shorter side 256, centre crop 224, mean/std."""
    return ModelSpec(
        name=name,
        description=description,
        network=network,
        labels=imagenet_labels,
        size=224,
        resize=256,
        color="RGB",
        mean=IMAGENET_MEAN,
        std=IMAGENET_STD,
        trained=False,
    )


# Longest build first, so parallel build processes finish at about the same time.
SPECS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="shapes_grid_mnv2",
            description="Anchor-free grid detector (stride 8, one-level FPN) on MobileNetV2 at "
            "width 0.5, 96×96 letterboxed RGB, trained on synthetic scenes of four shapes; "
            "outputs decoded boxes [N, 4 + C] (normalised centre-size, sigmoid scores)",
            network=shapes_grid_mnv2,
            labels=shape_labels,
            size=DETECTOR_SIZE,
            resize=None,
            color="RGB",
            mean=(0.5, 0.5, 0.5),
            std=(0.5, 0.5, 0.5),
            trained=True,
            max_batch_size=8,
            task="detection",
            letterbox=True,
            detection={
                "style": "yolo",
                "box_format": "cxcywh",
                "normalized": True,
                "activation": "none",
                "score_threshold": 0.25,
                "iou_threshold": 0.45,
                "max_detections": 20,
            },
        ),
        ModelSpec(
            name="mobilevit_xxs",
            description="MobileViT-XXS 256, ImageNet-1k classes; seeded weights (not trained) "
            "made well-conditioned on photographs",
            network=mobilevit_xxs,
            labels=imagenet_labels,
            size=256,
            resize=288,
            color="RGB",
            mean=(0.0, 0.0, 0.0),  # Apple's MobileViT takes plain 0..1 pixels
            std=(1.0, 1.0, 1.0),
            trained=False,
            max_batch_size=4,
        ),
        ModelSpec(
            name="digits_mnv3",
            description="MobileNetV3-Small design at width 0.5 for 32×32 greyscale digits, "
            "trained on scikit-learn's digits (8×8 upscaled; white ink on black)",
            network=digits_mnv3,
            labels=digit_labels,
            size=32,
            resize=None,
            color="L",
            mean=(0.5,),
            std=(0.5,),
            trained=True,
            max_batch_size=32,
            max_queue_delay_ms=1.0,
        ),
        imagenet_224(
            "mobilenet_v2",
            "MobileNetV2 1.0 224, ImageNet-1k classes; seeded weights (not trained: the labels "
            "are not meaningful) made well-conditioned on photographs",
            mobilenet_v2,
        ),
        imagenet_224(
            "mobilenet_v3_small",
            "MobileNetV3-Small 224, ImageNet-1k classes; seeded weights (not trained) made "
            "well-conditioned on photographs",
            mobilenet_v3_small,
        ),
    )
}
