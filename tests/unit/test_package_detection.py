"""model.toml's ``[detection]`` table and ``letterbox``: what a detector package may say."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from devtools.package import read_model_toml, write_model_toml
from edgeagent.models.package import PackageError, load_package
from tests.support.helpers import write_tiny_package


def detector(root: Path, detection: dict[str, Any], outputs: int = 1, **top: Any) -> Path:
    """The tiny package re-declared as a detector with ``outputs`` output tensors."""
    write_tiny_package(root)
    data = read_model_toml(root)
    data["task"] = "detection"
    data["outputs"] = [
        {"name": f"out{i}", "dtype": "float32", "shape": [-1, 8, 6]} for i in range(outputs)
    ]
    data["detection"] = detection
    data.update(top)
    write_model_toml(root, data)
    return root


def test_a_yolo_head_is_read_with_its_thresholds(tmp_path: Path) -> None:
    package = load_package(detector(tmp_path / "p", {"style": "yolo", "score_threshold": 0.4}))
    assert package.detection is not None and package.detection.score_threshold == 0.4
    assert package.anchors is None


def test_an_ssd_head_generates_its_anchors(tmp_path: Path) -> None:
    table = {
        "style": "ssd",
        "activation": "sigmoid",
        "anchors": {"feature_maps": [4, 2], "scales": [0.2, 0.4, 0.6], "aspect_ratios": [1.0]},
    }
    package = load_package(detector(tmp_path / "p", table, outputs=2))
    assert package.anchors is not None and package.anchors.shape == ((16 + 4) * 2, 4)


def test_a_postprocessed_head_is_read(tmp_path: Path) -> None:
    table = {"style": "postprocessed", "box_format": "yxyx", "normalized": True}
    package = load_package(detector(tmp_path / "p", {**table, "first_class_id": 1}, outputs=4))
    assert package.detection is not None
    assert (package.detection.style, package.detection.first_class_id) == ("postprocessed", 1)
    assert package.detection.box_format == "yxyx" and package.anchors is None


def test_an_ssd_head_reads_its_anchors_file(tmp_path: Path) -> None:
    root = detector(tmp_path / "p", {"style": "ssd", "anchors": "anchors.npy"}, outputs=2)
    np.save(root / "anchors.npy", np.full((5, 4), 0.5, np.float32))
    package = load_package(root)
    assert package.anchors is not None and package.anchors.shape == (5, 4)


@pytest.mark.parametrize(
    ("detection", "outputs", "words"),
    [
        ({"style": "ssd"}, 2, "detection.anchors: missing required field"),
        ({"style": "ssd", "anchors": "none.npy"}, 2, "cannot read 'none.npy'"),
        ({"style": "yolo"}, 2, "a yolo-style head has 1 output(s)"),
        ({"style": "yolo", "iou_threshold": 1.5}, 1, "iou_threshold: must be between 0 and 1"),
        ({"style": "yolo", "anchors": "a.npy"}, 1, "a YOLO-style head has no anchors"),
        ({"style": "retina"}, 1, "'retina' is not one of yolo, ssd"),
        ({"style": "postprocessed"}, 2, "a postprocessed-style head has 3 or 4 output"),
        ({"style": "postprocessed", "first_class_id": 5}, 4, "first_class_id: must be 0 or 1"),
        ({"style": "postprocessed", "anchors": "a.npy"}, 4, "postprocessed-style head has no"),
        ({"style": "yolo", "box_format": "yxxy"}, 1, "'yxxy' is not one of cxcywh, xyxy, yxyx"),
        ({"style": "yolo", "box": "x"}, 1, "unknown field(s) box"),
        (
            {"style": "ssd", "anchors": {"feature_maps": [4], "scales": [0.2]}},
            2,
            "one scale per feature map plus one",
        ),
    ],
)
def test_a_bad_detection_table_is_refused_naming_the_field(
    tmp_path: Path, detection: dict, outputs: int, words: str
) -> None:
    with pytest.raises(PackageError) as caught:
        load_package(detector(tmp_path / "p", detection, outputs=outputs))
    assert words in str(caught.value)


def test_a_detection_table_needs_the_detection_task(tmp_path: Path) -> None:
    root = detector(tmp_path / "p", {"style": "yolo"}, task="tensor")
    with pytest.raises(PackageError, match='needs task = "detection"'):
        load_package(root)


def test_letterbox_excludes_a_crop(tmp_path: Path) -> None:
    root = write_tiny_package(tmp_path / "p")
    data = read_model_toml(root)
    data["preprocess"].update({"letterbox": True, "resize": 10})
    write_model_toml(root, data)
    with pytest.raises(PackageError, match="letterbox pads instead of cropping"):
        load_package(root)


def test_resize_filter_is_read_and_written(tmp_path: Path) -> None:
    root = write_tiny_package(tmp_path / "p")
    assert load_package(root).preprocess.resize_filter == "bilinear"  # absent: the default
    data = read_model_toml(root)
    data["preprocess"]["resize_filter"] = "lanczos"
    write_model_toml(root, data)
    assert load_package(root).preprocess.resize_filter == "lanczos"
    data["preprocess"]["resize_filter"] = "spline"
    write_model_toml(root, data)
    with pytest.raises(PackageError, match="'spline' is not one of bilinear, nearest, bicubic"):
        load_package(root)
