"""``edgeagent infer``: classify images with a model package, locally or through a running agent."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from edgeagent.models.locate import resolve_package
from edgeagent.models.package import PackageError, load_package
from edgeagent.models.preprocess import ImageError, preprocess_image, top_k
from edgeagent.models.session import VariantChoiceError, open_variant
from edgeagent.runtimes import RuntimeLoadError, RuntimeUnavailable


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "infer",
        help="classify JPEG/PNG images with a model",
        description=(
            "Classify images with MODEL (a package directory, or a package name in the models "
            "directory). Without --runtime/--precision the best variant that loads here is used."
        ),
    )
    parser.add_argument("model", help="package directory or name (e.g. mobilenet_v2)")
    parser.add_argument("images", nargs="+", type=Path, help="JPEG or PNG files")
    add_variant_arguments(parser)
    parser.add_argument("--top-k", type=int, default=None, help="labels per image (default 5)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.set_defaults(handler=run)


def add_variant_arguments(parser: argparse.ArgumentParser) -> None:
    """The variant-selection flags shared by infer and bench."""
    parser.add_argument("--runtime", choices=["onnxruntime", "litert", "openvino"])
    parser.add_argument("--device", help="runtime device (CPU, CUDAExecutionProvider, NPU…)")
    parser.add_argument("--precision", choices=["fp32", "fp16", "int8"])
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads")
    parser.add_argument(
        "--models-dir", type=Path, default=None, help="where named packages live (default ./zoo)"
    )


def run(args: argparse.Namespace) -> int:
    try:
        package = load_package(resolve_package(args.model, args.models_dir))
        session = open_variant(package, args.runtime, args.precision, args.device, args.threads)
    except (PackageError, VariantChoiceError, RuntimeLoadError, RuntimeUnavailable) as exc:
        print(f"edgeagent infer: {exc}", file=sys.stderr)
        return 2
    k = args.top_k or package.postprocess.top_k
    results: list[dict[str, Any]] = []
    status = 0
    for image_path in args.images:
        try:
            if package.preprocess is None:
                raise ImageError(f"package {package.name} has no [preprocess] for images")
            batch = preprocess_image(image_path.read_bytes(), package.preprocess)
        except (OSError, ImageError) as exc:
            print(f"edgeagent infer: {image_path}: {exc}", file=sys.stderr)
            status = 1
            continue
        started = time.perf_counter()
        outputs = session.run({package.inputs[0].name: batch})
        latency_ms = (time.perf_counter() - started) * 1000
        scores = outputs[package.outputs[0].name][0]
        predictions = top_k(scores, package.labels, k, package.postprocess.softmax)
        results.append(
            {
                "image": str(image_path),
                "model": package.name,
                "version": package.version,
                "runtime": session.runtime,
                "device": session.device,
                "precision": session.precision,
                "latency_ms": round(latency_ms, 3),
                "top_k": [p.__dict__ for p in predictions],
            }
        )
    session.close()
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        for result in results:
            print(
                f"{result['image']}: {result['model']} v{result['version']} on "
                f"{result['runtime']}/{result['device']}/{result['precision']} "
                f"({result['latency_ms']:.1f} ms)"
            )
            for p in result["top_k"]:
                print(f"  {p['score']:7.2%}  {p['label']}")
    return status
