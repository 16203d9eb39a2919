"""A PyTorch module (``file.py:factory`` + a state_dict) exported to ONNX with a dynamic batch.

Torch is a build-time tool, never an agent dependency: ``edgeagent package file.py:factory``
exports in-process where torch is importable; elsewhere run this module with a Python that has
torch (``python /path/to/edgeagent/packaging/torch_export.py file.py:factory --weights w.pt
--input-size 224,224 --out model.onnx``) and package the ONNX it writes.

A build environment has torch but not necessarily edgeagent, so ``python -m
edgeagent.packaging.torch_export`` works only where edgeagent is importable (the repository
root, or an environment it is installed in); run by its path, the file finds its own package
from any directory. The error message names that path.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run by path: the checkout (or site-packages) holding edgeagent
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import numpy as np

from edgeagent.packaging.errors import PackagingError
from edgeagent.packaging.factories import import_factory

ONNX_OPSET = 18  # the exporter's native opset: no lossy version conversion; ORT ≥ 1.14 reads it


def export_onnx(
    model: Any, sample: np.ndarray, path: Path, input_name: str, output_name: str
) -> None:
    """FP32 ONNX with a dynamic batch dimension, weights embedded in the one file."""
    import torch

    batch = torch.export.Dim("batch", max=1024)
    torch.onnx.export(
        model,
        (torch.from_numpy(sample[:2]),),  # batch 1 would be specialised away
        str(path),
        input_names=[input_name],
        output_names=[output_name],
        dynamic_shapes=({0: batch},),
        opset_version=ONNX_OPSET,
        dynamo=True,
        external_data=False,
        optimize=True,
        verbose=False,
    )


def load_factory(spec: str, weights: Path | None) -> Any:
    """Import ``file.py``, call ``factory()``, load the weights; the module in eval mode."""
    file_name, _, factory = spec.rpartition(":")
    path = Path(file_name)
    if not path.is_file() or not factory:
        raise PackagingError(f"{spec}: expected FILE.py:FACTORY naming an existing file")
    try:
        import torch
    except ImportError as exc:
        raise PackagingError(
            f"{spec}: torch is not installed in this environment: run `python "
            f"{Path(__file__).resolve()} {spec} --input-size H,W --out model.onnx` with a "
            "Python that has torch (e.g. .venv-build), from any directory, and package the "
            ".onnx it writes"
        ) from exc
    make = import_factory(spec)
    model = make()
    if weights is not None:
        if not weights.is_file():
            raise PackagingError(f"--weights {weights}: no such file")
        model.load_state_dict(torch.load(weights, map_location="cpu", weights_only=True))
    return model.eval()


def export_factory(
    spec: str, weights: Path | None, size: tuple[int, int] | None, channels: int, out: Path
) -> Path:
    """Export ``spec`` to ``out`` (NCHW input ``input``, output ``output``); returns ``out``."""
    if size is None:
        raise PackagingError(
            f"{spec}: a PyTorch module does not say its input size: pass --input-size HEIGHT,WIDTH"
        )
    model = load_factory(spec, weights)
    sample = np.random.default_rng(0).standard_normal((2, channels, *size)).astype(np.float32)
    export_onnx(model, sample, out, "input", "output")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Export file.py:factory to ONNX")
    parser.add_argument("source", help="FILE.py:FACTORY")
    parser.add_argument("--weights", type=Path)
    parser.add_argument("--input-size", required=True, help="HEIGHT,WIDTH")
    parser.add_argument("--channels", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    height, width = (int(v) for v in args.input_size.split(","))
    try:
        export_factory(args.source, args.weights, (height, width), args.channels, args.out)
    except PackagingError as exc:
        print(f"torch_export: {exc}", file=sys.stderr)
        return 2
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
