"""Fine-tune a classifier's head on reviewed field samples, keeping what it knew.

The package's fp32 ONNX is cut before its head — the linear layers at its end (``Gemm``,
activation, ``Gemm`` …): the rest is a frozen feature extractor run by onnxruntime, the head
is rebuilt in torch from the graph's own weights and trained. Two terms:

- cross-entropy on the reviewed samples (a person accepted or corrected their class);
- the old head's soft outputs on the unreviewed samples (temperature ``T``, KL divergence):
  the old model is the teacher of what the field still looks like, so learning the new
  distribution does not forget the old one (no old training data is needed at the hub).

The new weights are written back into a copy of the ONNX (only the head's initializers
change), which then goes through ``edgeagent package`` like any model. Torch, onnx and
onnxruntime must be importable: run this file with a Python that has them (``.venv-build``),
by its path; ``edgeagent hub train`` does that.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run by path: the checkout (or site-packages) holding edgeagent
    sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import numpy as np

from edgeagent.hub.train.runner import (
    NoStartingPoint,
    answer,
    fp32_source,
    session_with,
    trainer_parser,
)
from edgeagent.models.package import load_package
from edgeagent.models.preprocess import decode_image, image_tensor

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


class TrainError(ValueError):
    pass


# Elementwise activations allowed between two linear layers of the head, as torch computes them.
ACTIVATIONS = ("Relu", "HardSwish", "Sigmoid", "Tanh")


@dataclass
class Linear:
    """One Gemm of the head: its node, weight [out, in] and bias, and the activation after it."""

    node: Any
    weight: np.ndarray
    bias: np.ndarray
    activation: str = ""  # "" for the last layer


def _producer(graph: Any, tensor: str) -> Any:
    return next((n for n in graph.node if tensor in n.output), None)


def _linear(node: Any, inits: dict[str, Any]) -> Linear:
    import onnx.numpy_helper

    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    if attrs.get("transA", 0) or attrs.get("alpha", 1.0) != 1.0 or attrs.get("beta", 1.0) != 1.0:
        raise TrainError(f"Gemm {node.name!r} has transA/alpha/beta: not a plain linear layer")
    if node.input[1] not in inits or len(node.input) < 3 or node.input[2] not in inits:
        raise TrainError(f"Gemm {node.name!r}: its weight and bias are not constants")
    weight = onnx.numpy_helper.to_array(inits[node.input[1]]).astype(np.float32)
    if not attrs.get("transB", 0):
        weight = weight.T
    bias = onnx.numpy_helper.to_array(inits[node.input[2]]).astype(np.float32)
    return Linear(node, weight, bias)


def head_layers(model: Any) -> tuple[list[Linear], str]:
    """The classifier's head — the linear layers (Gemm, activation, Gemm …) that end in its
    first output — in forward order, and the tensor that feeds it (the frozen features)."""
    graph = model.graph
    inits = {i.name: i for i in graph.initializer}
    node = _producer(graph, graph.output[0].name)
    if node is None or node.op_type != "Gemm":
        raise TrainError(
            f"the output {graph.output[0].name!r} is not made by a Gemm (a linear head)"
        )
    layers = [_linear(node, inits)]
    while True:
        activation = _producer(graph, layers[0].node.input[0])
        if activation is None or activation.op_type not in ACTIVATIONS:
            break
        before = _producer(graph, activation.input[0])
        if before is None or before.op_type != "Gemm":
            break
        layer = _linear(before, inits)
        layer.activation = activation.op_type
        layers.insert(0, layer)
    return layers, layers[0].node.input[0]


def features(onnx_path: Path, tensors: np.ndarray, input_name: str, threads: int) -> np.ndarray:
    """The head's input for each row (the frozen part of the network, by onnxruntime)."""
    import onnx

    model = onnx.load(str(onnx_path))
    _, feature = head_layers(model)
    session = session_with(model, feature, threads)
    out = [
        session.run([feature], {input_name: tensors[i : i + 64]})[0]
        for i in range(0, len(tensors), 64)
    ]
    return np.concatenate(out).reshape(len(tensors), -1).astype(np.float32)


def load_folder(root: Path, labels: tuple[str, ...], spec: Any) -> tuple[np.ndarray, np.ndarray]:
    """An ImageFolder (one folder per class, named as in ``labels``) as tensors + class ids."""
    tensors, ids = [], []
    for index, name in enumerate(labels):
        folder = root / name
        if not folder.is_dir():
            continue
        for path in sorted(folder.iterdir()):
            if path.suffix.lower() in IMAGE_SUFFIXES:
                tensors.append(image_tensor(decode_image(path.read_bytes()), spec)[0])
                ids.append(index)
    unknown = sorted({p.name for p in root.iterdir() if p.is_dir()} - set(labels))
    if unknown:
        raise TrainError(f"{root}: classes {unknown} are not the model's labels")
    if not tensors:
        return np.zeros((0,), np.float32), np.zeros((0,), np.int64)
    return np.stack(tensors), np.asarray(ids, np.int64)


def load_images(root: Path | None, spec: Any) -> np.ndarray:
    if root is None or not root.is_dir():
        return np.zeros((0,), np.float32)
    paths = sorted(p for p in root.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
    if not paths:
        return np.zeros((0,), np.float32)
    return np.stack([image_tensor(decode_image(p.read_bytes()), spec)[0] for p in paths])


def _forward(layers: list[Linear], params: list[Any], x: Any) -> Any:
    import torch

    acts = {
        "Relu": torch.relu,
        "HardSwish": torch.nn.functional.hardswish,
        "Sigmoid": torch.sigmoid,
        "Tanh": torch.tanh,
    }
    for index, layer in enumerate(layers):
        x = x @ params[2 * index].T + params[2 * index + 1]
        if layer.activation:
            x = acts[layer.activation](x)
    return x


def train_head(
    layers: list[Linear],
    labelled: tuple[np.ndarray, np.ndarray],
    unlabelled: np.ndarray,
    *,
    steps: int,
    lr: float,
    temperature: float,
    teacher_weight: float,
    seed: int = 0,
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Adam on the full batch: CE(labelled) + teacher_weight·T²·KL(old head ‖ new head);
    the new (weight, bias) of each layer."""
    import torch

    torch.manual_seed(seed)
    old = [torch.from_numpy(a.copy()) for layer in layers for a in (layer.weight, layer.bias)]
    params = [torch.nn.Parameter(t.clone()) for t in old]
    x, y = torch.from_numpy(labelled[0]), torch.from_numpy(labelled[1])
    u = torch.from_numpy(unlabelled) if len(unlabelled) else None
    teacher = None
    if u is not None:
        with torch.no_grad():
            teacher = torch.softmax(_forward(layers, old, u) / temperature, dim=1)
    optimiser = torch.optim.Adam(params, lr=lr)
    functional = torch.nn.functional
    for _ in range(steps):
        optimiser.zero_grad()
        loss = functional.cross_entropy(_forward(layers, params, x), y)
        if u is not None and teacher is not None:
            student = torch.log_softmax(_forward(layers, params, u) / temperature, dim=1)
            kl = functional.kl_div(student, teacher, reduction="batchmean")
            loss = loss + teacher_weight * temperature**2 * kl
        loss.backward()
        optimiser.step()
    trained = [p.detach().numpy() for p in params]
    return [(trained[2 * i], trained[2 * i + 1]) for i in range(len(layers))]


def predict(layers: list[Linear], values: list[tuple[np.ndarray, np.ndarray]], x: np.ndarray):
    import torch

    flat = [torch.from_numpy(a) for pair in values for a in pair]
    with torch.no_grad():
        return _forward(layers, flat, torch.from_numpy(x)).numpy()


def write_head(source: Path, out: Path, values: list[tuple[np.ndarray, np.ndarray]]) -> None:
    """A copy of ``source`` whose head layers hold ``values`` ((weight [out, in], bias) each)."""
    import onnx
    import onnx.numpy_helper

    model = onnx.load(str(source))
    layers, _ = head_layers(model)
    replace: dict[str, np.ndarray] = {}
    for layer, (weight, bias) in zip(layers, values, strict=True):
        trans_b = any(a.name == "transB" and a.i for a in layer.node.attribute)
        replace[layer.node.input[1]] = weight if trans_b else weight.T
        replace[layer.node.input[2]] = bias
    for index, init in enumerate(model.graph.initializer):
        if init.name in replace:
            array = np.ascontiguousarray(replace[init.name].astype(np.float32))
            model.graph.initializer[index].CopyFrom(onnx.numpy_helper.from_array(array, init.name))
    onnx.save(model, str(out))


def fine_tune(
    package_dir: Path,
    train_dir: Path,
    unlabelled_dir: Path | None,
    out: Path,
    *,
    steps: int = 300,
    lr: float = 0.003,
    temperature: float = 2.0,
    teacher_weight: float = 5.0,
    threads: int = 2,
) -> dict[str, Any]:
    """Train the head of ``package_dir``'s fp32 ONNX on ``train_dir``; the ONNX to ``out``."""
    started = time.perf_counter()
    package = load_package(package_dir)
    if package.task != "classification" or package.preprocess is None:
        raise TrainError(f"{package.name}: head fine-tuning needs an image classifier")
    source = fp32_source(package)
    import onnx

    layers, _ = head_layers(onnx.load(str(source)))
    x, y = load_folder(train_dir, package.labels, package.preprocess)
    if len(x) == 0:
        raise TrainError(f"{train_dir}: no labelled images")
    unlabelled = load_images(unlabelled_dir, package.preprocess)
    input_name = package.inputs[0].name
    fx = features(source, x, input_name, threads)
    fu = features(source, unlabelled, input_name, threads) if len(unlabelled) else unlabelled
    values = train_head(
        layers,
        (fx, y),
        fu,
        steps=steps,
        lr=lr,
        temperature=temperature,
        teacher_weight=teacher_weight,
    )
    write_head(source, out, values)
    trained = float((predict(layers, values, fx).argmax(1) == y).mean())
    return {
        "layers": len(layers),
        "labelled": len(x),
        "unlabelled": len(unlabelled),
        "train_accuracy": round(trained, 4),
        "seconds": round(time.perf_counter() - started, 2),
        "onnx": str(out),
    }


def main(argv: list[str] | None = None) -> int:
    parser = trainer_parser(
        "fine-tune a classifier package's head", "ImageFolder of reviewed samples", lr=0.003
    )
    args = parser.parse_args(argv)
    return answer(
        lambda: fine_tune(
            args.package,
            args.train,
            args.unlabelled,
            args.out,
            steps=args.steps,
            lr=args.lr,
            threads=args.threads,
        ),
        (TrainError, NoStartingPoint),
    )


if __name__ == "__main__":
    sys.exit(main())
