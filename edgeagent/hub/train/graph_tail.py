"""The trainable tail of an ONNX graph: its last layers, rebuilt in torch from the graph itself.

A detector's head is the chain of layers that ends in its output: convolutions with their
activations, then the decode (sigmoid, scale and offset, reshape, transpose) that turns the
last convolution's map into box rows. The chain is followed back from the output through
nodes with one non-constant input each, and stops at the first node that joins two branches
(a feature pyramid's sum) or that this module cannot compute: that node's output is the *cut*,
the frozen features onnxruntime computes once per image.

Every node of the tail is computed by torch as ONNX defines it (``OPS``); the convolutions'
weights and biases are the trainable parameters, everything else stays as the graph holds it.
Training therefore needs no knowledge of the architecture: the decode the agent reads is the
one the loss sees. The trained weights are written back into a copy of the graph, where only
those initializers change.

Torch and onnx are imported inside the functions: this module runs in the build Python that
``edgeagent hub train`` names (``--torch-python``), never in the hub.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


class TailError(ValueError):
    pass


# The ops a tail may hold: each has one non-constant input (the chain) and constants.
ELEMENTWISE = ("Relu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "LeakyRelu", "Tanh")
SHAPE = ("Reshape", "Transpose", "Flatten")
ARITHMETIC = {
    "Mul": operator.mul,
    "Add": operator.add,
    "Sub": operator.sub,
    "Div": operator.truediv,
}
SUPPORTED = ("Conv", *ELEMENTWISE, *ARITHMETIC, *SHAPE)


@dataclass
class Tail:
    """The nodes from the cut to the output, in forward order, and the constants they read."""

    nodes: list[Any]
    cut: str
    constants: dict[str, np.ndarray]

    @property
    def convolutions(self) -> list[Any]:
        return [node for node in self.nodes if node.op_type == "Conv"]

    def after_last_convolution(self) -> list[Any]:
        """The decode: the nodes after the last convolution."""
        last = self.nodes.index(self.convolutions[-1])
        return self.nodes[last + 1 :]


def _attributes(node: Any) -> dict[str, Any]:
    import onnx

    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def find_tail(model: Any) -> Tail:
    """The tail ending in the graph's first output (see the module's docstring)."""
    import onnx.numpy_helper

    graph = model.graph
    initializers = {i.name: i for i in graph.initializer}
    producers = {out: node for node in graph.node for out in node.output}
    nodes: list[Any] = []
    tensor = graph.output[0].name
    while True:
        node = producers.get(tensor)
        if node is None or node.op_type not in SUPPORTED:
            break
        moving = [name for name in node.input if name and name not in initializers]
        if len(moving) != 1:
            break
        nodes.insert(0, node)
        tensor = moving[0]
    if not any(node.op_type == "Conv" for node in nodes):
        raise TailError(
            f"the output {graph.output[0].name!r} is not made by convolutions and a decode "
            f"this trainer computes ({', '.join(SUPPORTED)})"
        )
    nodes = nodes[next(i for i, node in enumerate(nodes) if node.op_type == "Conv") :]
    cut = next(name for name in nodes[0].input if name not in initializers)
    for node in nodes:
        if node.op_type == "Conv" and (len(node.input) < 3 or node.input[2] not in initializers):
            raise TailError(f"Conv {node.name!r} has no bias initializer to train")
    read = {name for node in nodes for name in node.input if name in initializers}
    constants = {name: onnx.numpy_helper.to_array(initializers[name]) for name in read}
    return Tail(nodes, cut, constants)


def _conv(node: Any, x: Any, weight: Any, bias: Any) -> Any:
    import torch

    attrs = _attributes(node)
    if attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET"):
        raise TailError(f"Conv {node.name!r}: auto_pad is not computed here")
    pads = list(attrs.get("pads", [0, 0, 0, 0]))
    half = len(pads) // 2
    if pads[:half] != pads[half:]:
        # torch pads the last axis first: (left, right, top, bottom) from ONNX's begins, ends
        order = [p for i in reversed(range(half)) for p in (pads[i], pads[i + half])]
        x = torch.nn.functional.pad(x, order)
        pads = [0] * len(pads)
    return torch.nn.functional.conv2d(
        x,
        weight,
        bias,
        stride=tuple(attrs.get("strides", [1, 1])),
        padding=tuple(pads[:half]),
        dilation=tuple(attrs.get("dilations", [1, 1])),
        groups=int(attrs.get("group", 1)),
    )


def _elementwise(node: Any, x: Any, constant: Callable[[int], Any]) -> Any:
    import torch

    attrs = _attributes(node)
    op = node.op_type
    if op == "Relu":
        return torch.relu(x)
    if op == "Sigmoid":
        return torch.sigmoid(x)
    if op == "Tanh":
        return torch.tanh(x)
    if op == "HardSwish":
        return torch.nn.functional.hardswish(x)
    if op == "LeakyRelu":
        return torch.nn.functional.leaky_relu(x, float(attrs.get("alpha", 0.01)))
    if op == "HardSigmoid":
        alpha, beta = float(attrs.get("alpha", 0.2)), float(attrs.get("beta", 0.5))
        return torch.clamp(alpha * x + beta, 0.0, 1.0)
    low = constant(1) if len(node.input) > 1 and node.input[1] else attrs.get("min")
    high = constant(2) if len(node.input) > 2 and node.input[2] else attrs.get("max")
    return torch.clamp(
        x, None if low is None else float(low), None if high is None else float(high)
    )


def _reshaped(node: Any, x: Any, constant: Callable[[int], Any]) -> Any:
    attrs = _attributes(node)
    if node.op_type == "Transpose":
        return x.permute(*attrs["perm"])
    if node.op_type == "Flatten":
        return x.flatten(int(attrs.get("axis", 1)))
    shape = [int(d) for d in constant(1)]
    if not attrs.get("allowzero", 0):  # 0 copies the input's dimension
        shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return x.reshape(shape)


class TailModel:
    """The tail as a torch computation; ``parameters`` are its convolutions' weights, biases."""

    def __init__(self, tail: Tail) -> None:
        import torch

        self.tail = tail
        self.parameters: dict[str, Any] = {}
        for node in tail.convolutions:
            for name in node.input[1:3]:
                initial = torch.from_numpy(tail.constants[name].astype(np.float32))
                self.parameters[name] = torch.nn.Parameter(initial)
        self.fixed = {
            name: torch.from_numpy(np.array(value))
            for name, value in tail.constants.items()
            if name not in self.parameters
        }

    def _value(self, name: str) -> Any:
        return self.parameters[name] if name in self.parameters else self.fixed[name]

    def run(self, x: Any, nodes: list[Any] | None = None) -> Any:
        """``x`` (the cut, or the input of ``nodes[0]``) through ``nodes`` (default: all)."""
        for node in self.tail.nodes if nodes is None else nodes:
            x = self._node(node, x)
        return x

    def _node(self, node: Any, x: Any) -> Any:
        def constant(index: int) -> Any:
            return self._value(node.input[index])

        op = node.op_type
        if op == "Conv":
            return _conv(node, x, constant(1), constant(2))
        if op in ELEMENTWISE:
            return _elementwise(node, x, constant)
        if op in SHAPE:
            return _reshaped(node, x, constant)
        moving_first = node.input[0] not in self.tail.constants
        other = constant(1 if moving_first else 0).to(x.dtype)
        left, right = (x, other) if moving_first else (other, x)
        return ARITHMETIC[op](left, right)

    def trained(self) -> dict[str, np.ndarray]:
        return {name: p.detach().numpy().astype(np.float32) for name, p in self.parameters.items()}


class FrozenPart:
    """The graph up to the cut, run by onnxruntime (built once, for every set of images)."""

    def __init__(self, model: Any, tail: Tail, input_name: str, threads: int) -> None:
        from edgeagent.hub.train.runner import session_with

        self.names = [tail.cut, model.graph.output[0].name]
        self.input_name = input_name
        self.session = session_with(model, tail.cut, threads)

    def run(self, tensors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The cut tensor for each row, and the graph's own output for it (what the rebuilt
        tail must compute from the cut)."""
        if not len(tensors):
            return tensors, tensors
        batches = [
            self.session.run(self.names, {self.input_name: tensors[i : i + 32]})
            for i in range(0, len(tensors), 32)
        ]
        return (
            np.concatenate([b[0] for b in batches]).astype(np.float32),
            np.concatenate([b[1] for b in batches]).astype(np.float32),
        )


def check_tail(model: TailModel, cut: np.ndarray, output: np.ndarray, atol: float = 1e-4) -> None:
    """Refuse a tail whose torch computation differs from the graph's on the same rows: an op
    read wrongly here would train a head the agent never runs."""
    import torch

    with torch.no_grad():
        rebuilt = model.run(torch.from_numpy(cut)).numpy()
    if rebuilt.shape != output.shape or not np.allclose(rebuilt, output, atol=atol):
        difference = np.abs(rebuilt - output).max() if rebuilt.shape == output.shape else "shape"
        raise TailError(
            f"the head rebuilt in torch does not compute what the graph does ({difference}): "
            f"ops {sorted({n.op_type for n in model.tail.nodes})}"
        )


def write_tail(source: Path, out: Path, values: dict[str, np.ndarray]) -> None:
    """A copy of ``source`` whose initializers named in ``values`` hold them."""
    import onnx
    import onnx.numpy_helper

    model = onnx.load(str(source))
    for index, init in enumerate(model.graph.initializer):
        if init.name in values:
            array = np.ascontiguousarray(values[init.name])
            model.graph.initializer[index].CopyFrom(onnx.numpy_helper.from_array(array, init.name))
    onnx.save(model, str(out))
