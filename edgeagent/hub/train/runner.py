"""What the trainers share as programs run by path in the build Python (``--torch-python``):
their command line, the onnxruntime session that computes their frozen features, and how
they answer ``edgeagent hub train`` (one JSON report on stdout, or one line and exit 2)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def trainer_parser(description: str, train_help: str, lr: float) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("package", type=Path)
    parser.add_argument("--train", type=Path, required=True, help=train_help)
    parser.add_argument("--unlabelled", type=Path, help="unreviewed samples (the old head teaches)")
    parser.add_argument("--out", type=Path, required=True, help="the new ONNX file")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=lr)
    parser.add_argument("--threads", type=int, default=2)
    return parser


def answer(train: Callable[[], dict[str, Any]], refusals: tuple[type[Exception], ...]) -> int:
    """Print ``train()``'s report as JSON (0), or a refusal's one line on stderr (2)."""
    try:
        report = train()
    except (*refusals, OSError) as exc:  # type: ignore[misc]  # a tuple of exception classes
        print(f"train: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report))
    return 0


def session_with(model: Any, tensor: str, threads: int) -> Any:
    """A CPU onnxruntime session of ``model`` (an onnx ModelProto, changed in place) that also
    answers the intermediate ``tensor``, as its first output."""
    import onnx
    import onnxruntime as ort

    model.graph.output.insert(0, onnx.ValueInfoProto(name=tensor))
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


class NoStartingPoint(ValueError):
    """A package without the fp32 ONNX a trainer starts from."""


def fp32_source(package: Any) -> Path:
    """The package's onnxruntime fp32 file: the graph both trainers cut and write back."""
    variant = package.variant("onnxruntime", "fp32")
    if variant is None:
        raise NoStartingPoint(f"{package.name}: no onnxruntime fp32 variant to start from")
    return Path(variant.files[0])
