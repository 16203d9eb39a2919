"""``edgeagent infer``: classify images with a model package, locally or through a running agent."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from edgeagent.api.client import AgentClient, AgentError, AgentUnreachable
from edgeagent.commands.connection import add_connection_arguments, client_from_args
from edgeagent.commands.helpfmt import DefaultsFormatter
from edgeagent.config import load_config
from edgeagent.hardware.profile import ProfileError
from edgeagent.models.detector import decode_row, detections_json
from edgeagent.models.locate import resolve_package
from edgeagent.models.package import ModelPackage, PackageError, load_package
from edgeagent.models.preprocess import ImageError, prepare_image, preprocess_image, top_k
from edgeagent.models.session import VariantChoiceError, open_variant
from edgeagent.runtimes import RuntimeLoadError, RuntimeUnavailable, Session
from edgeagent.runtimes.facts import RUNTIME_NAMES
from edgeagent.sections import ConfigError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "infer",
        formatter_class=DefaultsFormatter,
        help="classify JPEG/PNG images with a model, or find objects with a detector",
        description=(
            "Classify images with MODEL (a package directory, or a package name in the models "
            "directory); a detector answers boxes instead, as /v1/models/NAME/detect does. "
            "A model of another task is refused. Without --runtime/--precision/--device the "
            "board's profile chooses, exactly as the daemon does (probed, cached under the state "
            "directory). With --socket or --url the images go to a running agent instead and "
            "MODEL is the name it serves; the agent then chooses the variant, so --runtime, "
            "--precision, --device and --threads are refused. Exit status 2: bad input "
            "(package, flags, config, unreachable agent); 1: an image could not be classified."
        ),
    )
    parser.add_argument("model", help="package directory or name (e.g. mobilenet_v2)")
    parser.add_argument("images", nargs="+", type=Path, help="JPEG or PNG files")
    add_variant_arguments(parser)
    parser.add_argument(
        "--top-k",
        type=int,
        default=None,
        help="labels per image (default: the package's, 5), or a detector's best boxes shown",
    )
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
        AgentError,  # asking the agent which task the model is: unreachable, unknown model
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
            _print(result)
    return status


def _print(result: dict[str, Any]) -> None:
    print(
        f"{result['image']}: {result['model']} v{result['version']} on "
        f"{result['runtime']}/{result['device']}/{result['precision']} "
        f"({result['latency_ms']:.1f} ms)"
    )
    for p in result.get("top_k", []):
        print(f"  {p['score']:7.2%}  {p['label']}")
    if "detections" in result:
        width, height = result["image_size"]
        found = result["detections"]
        print(f"  {len(found)} object(s) in {width}x{height}" + (":" if found else ""))
        for d in found:
            box = ", ".join(f"{v:.0f}" for v in d["box"])
            print(f"  {d['score']:7.2%}  {d['label']}  [{box}]")


Classifier = Callable[[bytes], dict[str, Any]]


def _local_classifier(args: argparse.Namespace) -> Classifier:
    """Load the package here; the profile chooses unless the flags name a variant. A detector
    answers boxes; any other task that is not a classifier is refused before loading."""
    package = load_package(resolve_package(args.model, args.models_dir))
    if package.preprocess is None:
        raise PackageError(f"package {package.name} has no [preprocess]: it takes no images")
    if package.task == "detection" and package.detection is not None:
        return _local_detector(package, _open(package, args), args.top_k)
    if package.task != "classification":
        raise PackageError(
            f"model {package.name} is a {package.task} model: infer classifies images or finds "
            f"objects with a detector; send its tensors to /v2/models/{package.name}/infer"
        )
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
            **_backend(package.name, package.version, session),
            "latency_ms": round(latency_ms, 3),
            "top_k": [p.__dict__ for p in predictions],
        }

    return classify


def _local_detector(package: ModelPackage, session: Session, shown: int | None) -> Classifier:
    """Boxes in the image's pixels, best first, decoded by the package's own head: the answer
    of the agent's /detect route (``shown`` keeps the best few)."""

    def detect(image: bytes) -> dict[str, Any]:
        assert package.preprocess is not None
        started = time.perf_counter()
        tensor, geometry = prepare_image(image, package.preprocess)
        answer = session.run({package.inputs[0].name: tensor})
        found = decode_row(package, [answer[s.name][0] for s in package.outputs], geometry)
        return {
            **_backend(package.name, package.version, session),
            "latency_ms": round((time.perf_counter() - started) * 1000, 3),
            "image_size": list(geometry.size),
            "detections": detections_json(package, found)[:shown],
        }

    return detect


def _backend(model: str, version: str, session: Session) -> dict[str, Any]:
    return {
        "model": model,
        "version": version,
        "runtime": session.runtime,
        "device": session.device,
        "precision": session.precision,
    }


def _open(package: ModelPackage, args: argparse.Namespace) -> Session:
    if args.runtime or args.precision or args.device:
        return open_variant(package, args.runtime, args.precision, args.device, args.threads)
    from edgeagent.hardware.service import Accelerators

    config = load_config(args.config)
    return Accelerators(config.hardware, config.agent.state_dir).open(package)


def _remote_classifier(args: argparse.Namespace) -> Classifier:
    """Send the image bytes to a running agent's /v1/models/{name}/classify, or /detect when
    the model it serves under that name is a detector (its config says which)."""
    client = client_from_args(args)
    if client.task(args.model) == "detection":
        return _remote_detector(client, args.model, args.top_k)

    def classify(image: bytes) -> dict[str, Any]:
        answer = client.classify(args.model, image, args.top_k)
        ranked = zip(answer["labels"], answer["indices"], answer["scores"], strict=True)
        top = [{"label": lb, "index": i, "score": sc} for lb, i, sc in ranked]
        return {**_served(answer), "top_k": top}

    return classify


def _remote_detector(client: AgentClient, model: str, shown: int | None) -> Classifier:
    def detect(image: bytes) -> dict[str, Any]:
        answer = client.detect(model, image)
        shown_boxes = answer["detections"][:shown]
        return {**_served(answer), "image_size": answer["image_size"], "detections": shown_boxes}

    return detect


def _served(answer: dict[str, Any]) -> dict[str, Any]:
    """Which model, version and backend answered, and how fast: from the agent's answer."""
    return {
        "model": answer["model_name"],
        "version": answer["model_version"],
        "runtime": answer["backend"],
        "device": answer["device"],
        "precision": answer["precision"],
        "latency_ms": float(answer["latency_ms"]),
    }
