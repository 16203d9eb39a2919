"""``edgeagent infer``: classify images with a model package, locally or through a running agent."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgeagent.api.client import AgentError, AgentUnreachable
from edgeagent.commands.connection import add_connection_arguments, client_from_args
from edgeagent.commands.helpfmt import DefaultsFormatter
from edgeagent.config import load_config
from edgeagent.hardware.profile import ProfileError
from edgeagent.models.locate import resolve_package
from edgeagent.models.package import ModelPackage, PackageError, load_package
from edgeagent.models.preprocess import ImageError, preprocess_image, top_k
from edgeagent.models.session import VariantChoiceError, open_variant
from edgeagent.runtimes import RuntimeLoadError, RuntimeUnavailable, Session
from edgeagent.runtimes.facts import RUNTIME_NAMES
from edgeagent.sections import ConfigError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "infer",
        formatter_class=DefaultsFormatter,
        help="classify JPEG/PNG images with a model",
        description=(
            "Classify images with MODEL (a package directory, or a package name in the models "
            "directory). Without --runtime/--precision/--device the board's profile chooses, "
            "exactly as the daemon does (probed, cached under the state directory). With "
            "--socket or --url the images go to a running agent instead and MODEL is the name "
            "it serves; the agent then chooses the variant, so --runtime, --precision, --device "
            "and --threads are refused. Exit status 2: bad input (package, flags, config, "
            "unreachable agent); 1: an image could not be classified."
        ),
    )
    parser.add_argument("model", help="package directory or name (e.g. mobilenet_v2)")
    parser.add_argument("images", nargs="+", type=Path, help="JPEG or PNG files")
    add_variant_arguments(parser)
    parser.add_argument("--top-k", type=int, default=None, help="labels per image (default 5)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    add_connection_arguments(parser)
    parser.set_defaults(handler=run)


def add_variant_arguments(parser: argparse.ArgumentParser) -> None:
    """The variant-selection flags shared by infer and bench."""
    parser.add_argument(
        "--runtime", choices=RUNTIME_NAMES, help="use this runtime (default: the profile chooses)"
    )
    parser.add_argument("--device", help="runtime device (CPU, CUDAExecutionProvider, NPU…)")
    parser.add_argument(
        "--precision",
        choices=["fp32", "fp16", "int8"],
        help="use this precision's variant (default: the profile chooses)",
    )
    parser.add_argument("--threads", type=int, default=None, help="intra-op threads")
    parser.add_argument(
        "--models-dir", type=Path, default=None, help="where named packages live (default ./zoo)"
    )


def run(args: argparse.Namespace) -> int:
    remote = bool(args.socket or args.url)
    chosen = [
        f"--{name}" for name in ("runtime", "precision", "device", "threads") if getattr(args, name)
    ]
    if remote and chosen:
        print(
            f"edgeagent infer: {', '.join(chosen)} cannot be used with --socket/--url: the running "
            "agent serves the variant its board profile chose (see `edgeagent status`)",
            file=sys.stderr,
        )
        return 2
    try:
        classify = _remote_classifier(args) if remote else _local_classifier(args)
    except (
        PackageError,
        VariantChoiceError,
        RuntimeLoadError,
        RuntimeUnavailable,
        ConfigError,
        ProfileError,
    ) as exc:
        print(f"edgeagent infer: {exc}", file=sys.stderr)
        return 2
    results: list[dict[str, Any]] = []
    status = 0
    for image_path in args.images:
        try:
            result = classify(image_path.read_bytes())
        except (OSError, ImageError) as exc:
            print(f"edgeagent infer: {image_path}: {exc}", file=sys.stderr)
            status = 1
            continue
        except AgentUnreachable as exc:
            print(f"edgeagent infer: {exc}", file=sys.stderr)
            return 2
        except AgentError as exc:  # this image was refused; the others may still be fine
            print(f"edgeagent infer: {image_path}: {exc}", file=sys.stderr)
            status = 1
            continue
        results.append({"image": str(image_path), **result})
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


Classifier = Callable[[bytes], dict[str, Any]]


def _local_classifier(args: argparse.Namespace) -> Classifier:
    """Load the package here; the profile chooses unless the flags name a variant."""
    package = load_package(resolve_package(args.model, args.models_dir))
    if package.preprocess is None:
        raise PackageError(f"package {package.name} has no [preprocess]: it takes no images")
    session = _open(package, args)
    k = args.top_k or package.postprocess.top_k

    def classify(image: bytes) -> dict[str, Any]:
        assert package.preprocess is not None
        batch = preprocess_image(image, package.preprocess)
        started = time.perf_counter()
        outputs = session.run({package.inputs[0].name: batch})
        latency_ms = (time.perf_counter() - started) * 1000
        scores = outputs[package.outputs[0].name][0]
        predictions = top_k(scores, package.labels, k, package.postprocess.softmax)
        return {
            "model": package.name,
            "version": package.version,
            "runtime": session.runtime,
            "device": session.device,
            "precision": session.precision,
            "latency_ms": round(latency_ms, 3),
            "top_k": [p.__dict__ for p in predictions],
        }

    return classify


def _open(package: ModelPackage, args: argparse.Namespace) -> Session:
    if args.runtime or args.precision or args.device:
        return open_variant(package, args.runtime, args.precision, args.device, args.threads)
    from edgeagent.hardware.service import Accelerators

    config = load_config(args.config)
    return Accelerators(config.hardware, config.agent.state_dir).open(package)


def _remote_classifier(args: argparse.Namespace) -> Classifier:
    """Send the image bytes to a running agent's /v1/models/{name}/classify."""
    client = client_from_args(args)

    def classify(image: bytes) -> dict[str, Any]:
        answer = client.classify(args.model, image, args.top_k)
        ranked = zip(answer["labels"], answer["indices"], answer["scores"], strict=True)
        return {
            "model": answer["model_name"],
            "version": answer["model_version"],
            "runtime": answer["backend"],
            "device": answer["device"],
            "precision": answer["precision"],
            "latency_ms": float(answer["latency_ms"]),
            "top_k": [{"label": lb, "index": i, "score": sc} for lb, i, sc in ranked],
        }

    return classify
