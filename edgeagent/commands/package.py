"""``edgeagent package SOURCE… --out DIR``: turn model files into a validated package."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from edgeagent.commands.extras import missing_extra
from edgeagent.commands.helpfmt import DefaultsFormatter
from edgeagent.models.package import LAYOUTS, TASKS, PackageError
from edgeagent.models.tensor_tables import RESIZE_FILTERS
from edgeagent.packaging.errors import PackagingError
from edgeagent.packaging.options import PackageOptions
from edgeagent.packaging.quantize import CALIBRATION_METHODS
from edgeagent.packaging.task_checks import Thresholds
from edgeagent.packaging.variants import DEFAULT_VARIANTS, VARIANT_NAMES


def _numbers(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(v) for v in text.split(","))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: comma-separated numbers") from exc


def _size(text: str) -> tuple[int, int]:
    parts = text.replace("x", ",").split(",")
    if len(parts) != 2 or not all(p.isdigit() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r}: HEIGHT,WIDTH in pixels, e.g. 224,224")
    return int(parts[0]), int(parts[1])


def _shape(text: str) -> tuple[str, tuple[int, ...]]:
    """NAME=D0,D1,… (every dimension of that input; -1 keeps one open, NAME= is a scalar)."""
    name, sep, dims = text.partition("=")
    try:
        shape = tuple(int(d) for d in dims.split(",")) if dims.strip() else ()
    except ValueError:
        shape = (0,)
    if not sep or not name or any(d == 0 or d < -1 for d in shape):
        raise argparse.ArgumentTypeError(
            f"{text!r}: NAME=D0,D1,… with positive sizes or -1 (open), e.g. input=-1,512"
        )
    return name, shape


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number of at least 1")
    return int(text)


def _variants(text: str) -> tuple[str, ...]:
    names = tuple(v for v in text.split(",") if v)
    unknown = [v for v in names if v not in VARIANT_NAMES]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"{', '.join(unknown)}: not among {', '.join(VARIANT_NAMES)}"
        )
    return names


def unexpected(sources: list[str], exc: BaseException) -> str:
    """One clear line for a failure the packager has no message for: where it happened (the
    innermost edgeagent frame) and the cause, and that nothing was written."""
    import traceback

    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "edgeagent" in f.filename]
    where = f" in {Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else ""
    return (
        f"edgeagent package: {', '.join(sources)}: unexpected {type(exc).__name__}{where}: "
        f"{exc or 'no message'}; nothing was written: please report it with this line"
    )


def progress(line: str) -> None:
    print(f"edgeagent package: {line}", file=sys.stderr, flush=True)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "package",
        help="turn ONNX / TFLite / OpenVINO / PyTorch / GGUF models into a validated package",
        description=(
            "Read each SOURCE (model.onnx, model.tflite, model.xml with its .bin, a PyTorch "
            "file.py:factory with --weights, or a TensorFlow frozen graph .pb or SavedModel "
            "directory, converted by tf2onnx in .venv-tf), make the optimised variants of an "
            "fp32 ONNX "
            "(graph-optimised, INT8 from --calibration, OpenVINO IR, fp16), validate each "
            "against the fp32 reference and write a package the agent serves: model.toml, "
            "golden.npz, validation.json. A language model is one or more GGUF files (one per "
            "quantization) or a Hugging Face folder (converted to an f16 GGUF and quantized "
            "per --quantize): the highest-precision one is the reference, each other is kept "
            "only within --min-agreement and --max-perplexity-ratio; model.toml and golden.json."
            " Exit status 2 when a file or flag is unusable."
        ),
        formatter_class=DefaultsFormatter,
    )
    parser.add_argument("sources", nargs="+", metavar="SOURCE", help="model files, one per variant")
    parser.add_argument("--out", type=Path, required=True, help="the package directory to create")
    parser.add_argument("--name", help="package name (default: the first file's stem)")
    parser.add_argument("--version", default="1.0.0", help="MAJOR.MINOR.PATCH (default 1.0.0)")
    parser.add_argument(
        "--task",
        choices=TASKS,
        help="what the model computes (default: "
        "classification for one [batch, classes] output, else required)",
    )
    parser.add_argument("--labels", type=Path, help="class names, one per line")
    parser.add_argument("--description", default="", help="one line for model.toml")
    parser.add_argument(
        "--input-size",
        type=_size,
        metavar="H,W",
        help="image size for inputs whose height/width the file leaves open",
    )
    parser.add_argument(
        "--input-shape",
        type=_shape,
        action="append",
        default=[],
        metavar="NAME=D0,D1,…",
        help="every dimension of input NAME, for dimensions the file leaves open (any rank; "
        "-1 keeps one open, e.g. the batch); repeat for each input",
    )
    parser.add_argument(
        "--softmax",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="apply softmax to a classifier's scores (default: unless its outputs already are "
        "probabilities on the validation data)",
    )
    parser.add_argument("--layout", choices=LAYOUTS, help="input layout when the file is ambiguous")
    parser.add_argument(
        "--mean", type=_numbers, help="per-channel mean after --scale (e.g. 0.485,0.456,0.406)"
    )
    parser.add_argument("--std", type=_numbers, help="per-channel std after --scale")
    parser.add_argument(
        "--scale",
        type=float,
        default=1 / 255,
        help="pixel multiplier (default: 1/255 = 0.00392156862745098)",
    )
    parser.add_argument("--bgr", action="store_true", help="the model takes BGR channel order")
    parser.add_argument(
        "--crop",
        action="store_true",
        help="resize the shorter side to size/0.875 and centre-crop (default: stretch)",
    )
    parser.add_argument(
        "--resize-filter",
        choices=RESIZE_FILTERS,
        help="resampling filter of the image resize, as the model's own pipeline resizes "
        "(default: what the model's metadata names, else bilinear)",
    )
    parser.add_argument(
        "--variants",
        type=_variants,
        default=None,
        help=f"comma list of {', '.join(VARIANT_NAMES)} (default "
        f"{','.join(DEFAULT_VARIANTS)}, plus int8 with --calibration)",
    )
    parser.add_argument(
        "--weights",
        type=Path,
        help="file.py:factory's weights: a PyTorch state_dict, or a MindSpore .ckpt",
    )
    parser.add_argument(
        "--prune",
        type=_numbers,
        metavar="RATIO[,RATIO…]",
        help="PyTorch sources: remove this share of channels (torch-pruning); the largest ratio "
        "that passes validation and runs faster here is packaged",
    )
    parser.add_argument(
        "--prune-epochs",
        type=int,
        default=0,
        help="fine-tune each pruned network this many epochs on --calibration (labelled)",
    )
    parser.add_argument(
        "--distil-from",
        type=Path,
        metavar="TEACHER_PACKAGE",
        help="PyTorch sources: train file.py:factory to answer like this package (knowledge "
        "distillation on --calibration; class folders or .npz labels add their cross-entropy)",
    )
    parser.add_argument(
        "--distil-epochs", type=int, default=0, help="the student's epochs with --distil-from"
    )
    parser.add_argument(
        "--head-from",
        type=Path,
        metavar="DETECTOR_PACKAGE",
        help="a detector retrained or re-exported from this package: declare its [detection] "
        "head and letterbox (for a head the outputs alone do not give away)",
    )
    parser.add_argument("--channels", type=int, default=3, help="input channels of file.py:factory")
    for flag, what in (("inputs", "input"), ("outputs", "output")):
        parser.add_argument(
            f"--tf-{flag}",
            type=lambda text: tuple(n for n in text.split(",") if n),
            metavar="NAME[,NAME…]",
            help=f"a TensorFlow graph's {what} nodes (default: discovered from the graph)",
        )
    parser.add_argument(
        "--calibration",
        type=Path,
        metavar="DIR|FILE.npz",
        help="images (or tensors) to calibrate INT8 on",
    )
    parser.add_argument(
        "--calibration-method",
        choices=CALIBRATION_METHODS,
        default="minmax",
        help="how activation ranges are chosen from the calibration images",
    )
    parser.add_argument(
        "--reduce-range",
        choices=("auto", "on", "off"),
        default="auto",
        help="7-bit INT8 weights (auto: on for x86 CPUs without VNNI)",
    )
    parser.add_argument(
        "--heldout",
        type=Path,
        metavar="DIR|FILE.npz",
        help="validation images (ImageFolder dirs give accuracy); default: calibration",
    )
    parser.add_argument(
        "--max-top1-drop",
        type=float,
        default=1.0,
        help="points of top-1 agreement a variant may lose",
    )
    parser.add_argument(
        "--min-map",
        type=float,
        default=Thresholds.min_map,
        help="detectors: least mAP@0.5 of a variant's boxes against fp32's (0.98: 2 points lost)",
    )
    parser.add_argument(
        "--min-mask-iou",
        type=float,
        default=Thresholds.min_mask_iou,
        help="segmentation: least mean IoU of a variant's masks against fp32's",
    )
    parser.add_argument(
        "--min-cosine",
        type=float,
        default=Thresholds.min_cosine,
        help="other tasks: least cosine similarity of a variant's outputs to fp32's",
    )
    parser.add_argument(
        "--max-relative-error",
        type=float,
        default=Thresholds.max_relative_error,
        help="other tasks: largest |variant - fp32| / |fp32| per row",
    )
    parser.add_argument(
        "--min-agreement",
        type=float,
        default=0.8,
        help="language models: least share of the reference's greedy tokens a variant repeats "
        "before its first different one (mean over the golden chats)",
    )
    parser.add_argument(
        "--max-perplexity-ratio",
        type=float,
        default=1.15,
        help="language models: largest held-out perplexity of a variant ÷ the reference's",
    )
    parser.add_argument(
        "--golden-tokens",
        type=int,
        default=16,
        help="language models: greedy tokens recorded per golden chat",
    )
    parser.add_argument(
        "--quantize",
        default="q8_0",
        help="language models from a Hugging Face folder: llama.cpp quantizations of its f16 "
        "GGUF to judge beside it, comma-separated ('' for none)",
    )
    parser.add_argument(
        "--openvino",
        action="store_true",
        help="language models: also an OpenVINO GenAI IR variant of every GGUF (GenAI's own "
        "conversion), judged like the others",
    )
    parser.add_argument("--max-images", type=int, default=200, help="rows used per data set")
    parser.add_argument("--threads", type=int, help="intra-op threads when timing variants")
    parser.add_argument(
        "--timing-runs",
        type=_positive,
        default=30,
        help="batch-1 runs per variant whose median is its latency",
    )
    parser.add_argument("--json", action="store_true", help="print the validation report as JSON")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from edgeagent.packaging.text_generation import is_text_source

    text = [is_text_source(source) for source in args.sources]
    if any(text):
        if not all(text):
            print(
                "edgeagent package: a language model (.gguf) and tensor models cannot be one "
                "package: package them apart",
                file=sys.stderr,
            )
            return 2
        return _run_text(args)
    problem = missing_extra("package", "onnx", "sympy")  # read and quantize every source
    if problem is not None:
        print(f"edgeagent package: {problem}", file=sys.stderr)
        return 2
    from edgeagent.packaging.build import build_package
    from edgeagent.packaging.report import table

    options = PackageOptions(
        name=args.name,
        version=args.version,
        task=args.task,
        labels=args.labels,
        input_size=args.input_size,
        input_shapes=tuple(args.input_shape),
        softmax=args.softmax,
        layout=args.layout,
        mean=args.mean,
        std=args.std,
        scale=args.scale,
        bgr=args.bgr,
        crop=args.crop,
        resize_filter=args.resize_filter,
        variants=args.variants or (),
        weights=args.weights,
        prune=args.prune or (),
        prune_epochs=args.prune_epochs,
        distil_from=args.distil_from,
        distil_epochs=args.distil_epochs,
        head_from=args.head_from,
        channels=args.channels,
        tf_inputs=args.tf_inputs or (),
        tf_outputs=args.tf_outputs or (),
        calibration=args.calibration,
        calibration_method=args.calibration_method,
        reduce_range=args.reduce_range,
        heldout=args.heldout,
        max_top1_drop=args.max_top1_drop,
        max_images=args.max_images,
        threads=args.threads,
        timing_runs=args.timing_runs,
        description=args.description,
    )

    try:
        rules = Thresholds(
            args.min_map, args.min_mask_iou, args.min_cosine, args.max_relative_error
        )
        result = build_package(args.sources, args.out, options, progress, rules)
    except (PackagingError, PackageError) as exc:
        print(f"edgeagent package: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # a case no check above names: never a traceback to the user
        print(unexpected(args.sources, exc), file=sys.stderr)
        return 1
    if args.json:
        report = json.loads((result.out / "validation.json").read_text(encoding="utf-8"))
        print(json.dumps({"package": str(result.out), **report}, indent=2))
    else:
        print(table(result))
    return 0


def _run_text(args: argparse.Namespace) -> int:
    """A language model: GGUF files, one per quantization, judged by their task."""
    problem = missing_extra("llm", "gguf", "llama_cpp")
    if problem is not None:
        print(f"edgeagent package: {problem}", file=sys.stderr)
        return 2
    if not 0 <= args.min_agreement <= 1 or args.max_perplexity_ratio < 1:
        print(
            "edgeagent package: --min-agreement is a share (0..1) and --max-perplexity-ratio "
            "at least 1",
            file=sys.stderr,
        )
        return 2
    if not 1 <= args.golden_tokens <= 256:
        print("edgeagent package: --golden-tokens must be 1..256", file=sys.stderr)
        return 2
    from edgeagent.packaging.text_generation import (
        TextOptions,
        TextRules,
        package_text_model,
    )

    options = TextOptions(
        name=args.name,
        version=args.version,
        description=args.description,
        max_tokens=args.golden_tokens,
        threads=args.threads,
        quantize=tuple(p.strip().lower() for p in args.quantize.split(",") if p.strip()),
        openvino=args.openvino,
    )
    rules = TextRules(args.min_agreement, args.max_perplexity_ratio)
    try:
        result = package_text_model(args.sources, args.out, options, rules, progress)
    except (PackagingError, PackageError) as exc:
        print(f"edgeagent package: {exc}", file=sys.stderr)
        return 2
    variants: list[dict[str, Any]] = [
        {
            "variant": j.key,
            "kept": j.kept,
            "agreement": round(j.agreement, 4),
            "perplexity": round(j.perplexity, 4),
            "perplexity_ratio": round(j.perplexity_ratio, 4),
            "tokens_per_second": round(j.tokens_per_second, 1),
            **({"dropped": j.why} if not j.kept else {}),
        }
        for j in result.judgements
    ]
    report = {
        "package": str(result.out),
        "reference": result.reference,
        "seconds": round(result.seconds, 1),
        "variants": variants,
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        kept = [v["variant"] for v in variants if v["kept"]]
        print(f"{result.out}: text-generation, variants {', '.join(kept)}")
    return 0
