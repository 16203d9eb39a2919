#!/usr/bin/env python3
"""Retrain only the classifier of a zoo package's FP32 ONNX model: the case a delta is for.

A fleet that fine-tunes a deployed classifier usually freezes the backbone and retrains the
head (a linear layer over the pooled features). This script does exactly that on the zoo's
MobileNetV2, with PyTorch (``.venv-build``): the backbone's pooled features for random crops
of the bundled photographs are computed by onnxruntime on the model itself, a ``Linear`` head
initialised from the model's own weights is trained with Adam on them (Adam moves *every*
weight each step — the worst case for a binary diff), and the new weights are written back
into the same initializers, so the ONNX file differs from the old one only where a
retrained graph would. ``model.toml`` gets the new version and file hash; the other variants
are left out (a delta is measured per artifact: ``onnxruntime/fp32`` here).

    .venv-build/bin/python scripts/retrain_head.py zoo/mobilenet_v2 OUT [--classes N]

With ``--classes N`` (the usual transfer learning: the product's own N classes) the head is
replaced by an N-way one instead of fine-tuned.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import tomllib
import torch
from onnx import numpy_helper

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from modelbuild.data import normalize, photo_crops  # noqa: E402

from edgeagent.models.manifest_writer import write_table  # noqa: E402

MEAN, STD, SCALE = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225), 1 / 255


def _features(model: onnx.ModelProto, gemm: onnx.NodeProto, images: np.ndarray) -> np.ndarray:
    """The head's input (the pooled features) for ``images``, by the model itself."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    probe.graph.output.append(onnx.helper.make_tensor_value_info(gemm.input[0], 1, None))
    session = onnxruntime.InferenceSession(probe.SerializeToString())
    return session.run([gemm.input[0]], {"input": images})[0]


def retrain(package: Path, out: Path, classes: int | None, steps: int, seed: int) -> None:
    onnx_name = f"{package.name}.fp32.onnx"
    model = onnx.load(package / onnx_name)
    gemm = next(node for node in model.graph.node if node.op_type == "Gemm")
    weights = {init.name: init for init in model.graph.initializer}
    weight = weights[gemm.input[1]]
    bias = weights[gemm.input[2]] if len(gemm.input) > 2 else None  # this export folds none
    images = normalize(photo_crops(64, 224, seed), SCALE, MEAN, STD)
    features = torch.from_numpy(_features(model, gemm, images))
    torch.manual_seed(seed)
    old_w = numpy_helper.to_array(weight)
    head = torch.nn.Linear(old_w.shape[1], classes or old_w.shape[0], bias=bias is not None)
    if classes is None:  # fine-tune the existing head: start from its weights
        with torch.no_grad():
            head.weight.copy_(torch.from_numpy(old_w))
            if bias is not None:
                head.bias.copy_(torch.from_numpy(numpy_helper.to_array(bias)))
    targets = torch.randint(0, head.out_features, (len(features),))
    optimiser = torch.optim.Adam(head.parameters(), lr=1e-3)
    for _ in range(steps):
        optimiser.zero_grad()
        torch.nn.functional.cross_entropy(head(features), targets).backward()
        optimiser.step()
    for init, value in ((weight, head.weight), (bias, head.bias)):
        if init is not None:
            init.CopyFrom(numpy_helper.from_array(value.detach().numpy(), init.name))
    if classes is not None:
        dims = model.graph.output[0].type.tensor_type.shape.dim
        dims[1].dim_value = classes
    out.mkdir(parents=True, exist_ok=True)
    onnx.save(model, out / onnx_name)
    _write_package(package, out, onnx_name, "1.1.0", classes)


def _write_package(
    package: Path, out: Path, onnx_name: str, version: str, classes: int | None
) -> None:
    """model.toml (``version``, only the fp32 ONNX variant with its hash, no golden file: a
    retrained head answers differently) and the labels, beside the ONNX file in ``out``."""
    table = tomllib.loads((package / "model.toml").read_text(encoding="utf-8"))
    table["version"] = version
    table.pop("golden", None)
    digest = hashlib.sha256((out / onnx_name).read_bytes()).hexdigest()
    table["variant"] = [
        {**v, "sha256": {onnx_name: digest}} for v in table["variant"] if v["files"] == [onnx_name]
    ]
    labels = (package / "labels.txt").read_text(encoding="utf-8").splitlines()
    if classes is not None:
        table["outputs"][0]["shape"] = [-1, classes]
        labels = [f"class_{index}" for index in range(classes)]
    write_table(out, table)
    (out / "labels.txt").write_text("\n".join(labels) + "\n", encoding="utf-8")


def base_package(package: Path, out: Path) -> None:
    """The base release in the same shape (fp32 ONNX variant only, no golden file)."""
    out.mkdir(parents=True, exist_ok=True)
    onnx_name = f"{package.name}.fp32.onnx"
    shutil.copyfile(package / onnx_name, out / onnx_name)
    _write_package(package, out, onnx_name, "1.0.0", None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("package", type=Path)
    parser.add_argument("out", type=Path, help="writes OUT/base and OUT/retrained")
    parser.add_argument("--classes", type=int, default=None)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    base_package(args.package, args.out / "base")
    retrain(args.package, args.out / "retrained", args.classes, args.steps, args.seed)


if __name__ == "__main__":
    main()
