"""The packaging pipeline: sources → variants → validation → a package directory.

A little over 500 lines, on purpose: every stage (reading the sources, pruning or distilling,
the variants, validation, the golden records, the manifest) writes into one staging directory
that is moved in place only when all of them passed, and the stages' helpers live in their own
modules; what is left is their order and the report they share.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from edgeagent.models.manifest_writer import write_manifest
from edgeagent.models.package import Preprocess, load_package
from edgeagent.models.tasks import golden_record
from edgeagent.models.tasks.classification import ranked
from edgeagent.packaging.distillation import check_distil, distil_job, distil_source
from edgeagent.packaging.distillation import figures_json as distil_json
from edgeagent.packaging.errors import PackagingError
from edgeagent.packaging.feeds import golden_inputs, one_feed_record, tensor_samples, write_feeds
from edgeagent.packaging.images import Samples, load_samples
from edgeagent.packaging.manifest import describe
from edgeagent.packaging.mindspore_source import (
    check_against_mindspore,
    export_mindspore,
    is_mindspore_source,
)
from edgeagent.packaging.options import (
    LogicalModel,
    PackageOptions,
    default_name,
    logical_model,
)
from edgeagent.packaging.probabilities import wants_softmax
from edgeagent.packaging.pruning import check_prune, figures_json, prune_job, prune_source
from edgeagent.packaging.self_described import (
    answered_outputs,
    head_of,
    letterboxed,
    read_self,
)
from edgeagent.packaging.sources import SourceModel, read_source
from edgeagent.packaging.stateful import sequence_of
from edgeagent.packaging.task_checks import Head, Thresholds, golden_boxes_record
from edgeagent.packaging.task_guess import embedding_or_classifier, served_as_detector
from edgeagent.packaging.tensorflow_export import is_tensorflow_source
from edgeagent.packaging.tf_onnx import raw_pixel_options
from edgeagent.packaging.validate import VariantReport, as_json, judge, validate
from edgeagent.packaging.variants import (
    DEFAULT_VARIANTS,
    Failed,
    Made,
    Progress,
    make_variants,
    pin_input_shape,
    reduce_range_for,
)

GOLDEN_ROWS = 8
QUANTIZED_ONLY = "no fp32 source: the quantized file itself is the reference"


@dataclass(frozen=True)
class Result:
    """What ``edgeagent package`` prints: the package and each variant's figures."""

    out: Path
    reports: list[VariantReport]
    reference: dict
    seconds: float
    data: str  # what the validation ran on


def build_package(
    sources: Sequence[str],
    out: Path,
    options: PackageOptions,
    progress: Progress,
    thresholds: Thresholds | None = None,
) -> Result:
    """Build the package in a staging directory beside ``out`` and move it in place at the end.

    A failed build leaves nothing at ``out``.
    """
    started = time.perf_counter()
    check_prune(sources, options)
    check_distil(sources, options)
    if out.exists() and any(out.iterdir()):
        raise PackagingError(f"{out}: already exists and is not empty: pass a new --out directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{out.name}.") as tmp:
        staging, work = Path(tmp) / "package", Path(tmp) / "work"
        staging.mkdir()
        work.mkdir()
        models = [_source(spec, options, work, progress) for spec in sources]
        reference = _reference(models)
        if reference.precision != "fp32":
            progress(
                f"no fp32 source: {reference.path.name} ({reference.precision}) is its own "
                "reference (variants validated against it, golden records from it)"
            )
        asked_task = options.task
        options = raw_pixel_options(reference, options, progress)  # a uint8 TF graph: 0..255
        found = read_self(reference, options, progress)  # metadata names, imgsz, detector head
        options, rules = found.options, thresholds or Thresholds()
        logical = logical_model(reference, options)
        sequence = sequence_of(reference)  # served per client stream (engine.sequences)
        if sequence is not None:
            progress(f"stateful model: state in {_state_words(sequence.state, sequence.pairs)}")
        preprocess = letterboxed(_preprocess(reference, logical, options), found, options)
        labels = _labels(options, logical, found.names, work)
        head = head_of(found, logical)
        logical = served_as_detector(logical, head, preprocess, asked_task, found, progress)
        name = options.name or default_name(reference.path)
        source = _pinned(reference, logical, work)
        data, what = _heldout(options, preprocess, logical, labels)
        training = _training_data(options, preprocess, logical, labels)
        pruning = None  # --prune: the variants come from the pruned network that passed
        if options.prune:
            job = prune_job(sources[0], options, logical.inputs[0].shape, data, training)
            pruned, pruning = prune_source(job, source, work, progress)
            source = pruned or source
        distilling = None  # --distil-from: the variants come from the trained student
        if options.distil_from is not None and training is not None:
            student = distil_job(sources[0], options, logical.inputs[0].shape, data, training)
            source, distilling = distil_source(student, work, progress)
        made, failed = _variants(
            models,
            reference,
            source,
            name,
            staging,
            logical,
            preprocess,
            labels,
            options,
            progress,
        )
        feeds_path = work / "heldout.npz"
        write_feeds(feeds_path, logical, data)  # every input; a stack of feeds unless it batches
        names = ([t.name for t in logical.inputs], [t.name for t in logical.outputs])
        reports, ref_outputs, ref_timing, outputs = validate(
            made,
            source,
            names,
            feeds_path,
            work,
            classifier=logical.task == "classification",
            labels=data.labels,
            logical_layout=logical.layout,
            threads=options.threads,
            progress=progress,
            task=logical.task,
            head=head,
            reference_precision=reference.precision,
            repeats=options.timing_runs,
        )
        framework = None  # a framework's own answers where its export is the reference
        if is_mindspore_source(sources[0], options.weights):
            framework = check_against_mindspore(
                sources[0], options.weights, feeds_path, names, ref_outputs, work, progress
            )
        logical = answered_outputs(logical, ref_outputs)  # not the file's declaration
        if logical.task == "classification":  # probabilities already: no second softmax
            first = ref_outputs[logical.outputs[0].name]
            logical = replace(logical, softmax=wants_softmax(options.softmax, first))
        if asked_task is None and labels is None:
            logical = embedding_or_classifier(logical, ref_outputs, reports, progress)
        judge(reports, options.max_top1_drop, rules)
        kept = [m for m, r in zip(made, reports, strict=True) if r.kept]
        reports += [
            VariantReport(f.runtime, f.precision, f.device_class, f.how, False, f.reason)
            for f in failed
        ]
        if not kept:
            raise PackagingError(
                f"{reference.path}: no variant passed validation: "
                + "; ".join(f"{r.key}: {r.reason}" for r in reports)
            )
        for item, report in zip(made, reports, strict=False):  # failed ones have no files
            if not report.kept:
                for path in item.files:
                    path.unlink(missing_ok=True)
        # State inside the runtime: a shared session's answers depend on what it ran before,
        # so no golden record can hold for it (a health check runs it from any state).
        golden_file = None if sequence is not None and sequence.state == "variables" else "golden"
        if golden_file is not None:
            golden = _golden(logical, data.inputs, ref_outputs, outputs, reports, head)
            np.savez(
                staging / "golden.npz",
                allow_pickle=False,
                **golden_inputs(logical, data, golden["rows"]),
                **golden["record"],
            )
        if labels is not None:
            shutil.copyfile(labels, staging / "labels.txt")
        write_manifest(  # read back as the agent will: a bad package fails here, naming the field
            staging,
            describe(
                name=name,
                version=options.version,
                description=options.description,
                logical=logical,
                preprocess=preprocess,
                labels="labels.txt" if labels is not None else None,
                golden=None if golden_file is None else "golden.npz",
                variants=kept,
                root=staging,
                detection=head.head if head is not None else None,
                sequence=sequence,
            ),
        )
        reference_figures = {
            "file": reference.path.name,
            "precision": reference.precision,
            **({} if reference.precision == "fp32" else {"note": QUANTIZED_ONLY}),
            **ref_timing,
        }
        seconds = round(time.perf_counter() - started, 1)
        (staging / "validation.json").write_text(
            json.dumps(
                {
                    "data": what,
                    "rows": len(data.inputs),
                    "package_seconds": seconds,
                    "max_top1_drop": options.max_top1_drop,
                    "thresholds": asdict(rules),
                    "detector": found.detector.what if found.detector is not None else None,
                    "reference": reference_figures,
                    "framework": framework,
                    "pruning": None if pruning is None else figures_json(pruning),
                    "distillation": None if distilling is None else distil_json(distilling),
                    "variants": as_json(reports),
                },
                indent=2,
            )
            + "\n",
            encoding="utf-8",
        )
        load_package(staging)  # the result must load exactly as the agent will load it
        if out.exists():
            out.rmdir()  # empty (checked above): the staged package takes its place
        staging.rename(out)
    return Result(out, reports, reference_figures, seconds, what)


def _state_words(state: str, pairs: tuple[tuple[str, str], ...]) -> str:
    if state == "variables":
        return "the runtime's resource variables (one session per sequence)"
    return ", ".join(f"{i} <- {o}" for i, o in pairs) + " (fed back per sequence)"


def _source(spec: str, options: PackageOptions, work: Path, progress: Progress) -> SourceModel:
    if is_mindspore_source(spec, options.weights):  # MindSpore's exporter in .venv-ms
        size, channels = options.input_size, options.channels
        return read_source(export_mindspore(spec, options.weights, size, channels, work, progress))
    if ".py:" in spec:
        from edgeagent.packaging.torch_export import export_factory

        progress(f"PyTorch export to ONNX: {spec}")
        exported = work / f"{Path(spec.rpartition(':')[0]).stem}.onnx"
        size = options.input_size
        return read_source(export_factory(spec, options.weights, size, options.channels, exported))
    if is_tensorflow_source(spec):  # a frozen graph or SavedModel: tf2onnx in .venv-tf
        from edgeagent.packaging.tensorflow_export import export_tensorflow

        tf = (options.tf_inputs, options.tf_outputs)
        return read_source(export_tensorflow(spec, options.input_size, *tf, work, progress))
    return read_source(Path(spec))


def _pinned(reference: SourceModel, logical: LogicalModel, work: Path) -> Path:
    """The fp32 file variants are made from: the ONNX with --input-size written into it."""
    native = [t.shape[1:] for t in reference.inputs]
    if reference.runtime != "onnxruntime" or all(None not in shape for shape in native):
        return reference.path
    if len(reference.inputs) > 1:  # no int8 for these, and shape inference through control
        return reference.path  # flow breaks some (Silero VAD's If branches: LSTM rank 4)
    shapes = {t.name: t.shape for t in logical.inputs}
    return pin_input_shape(reference.path, shapes, work / reference.path.name)


def _reference(models: list[SourceModel]) -> SourceModel:
    """The file the others are judged against: the fp32 one (ONNX first, it is what variants
    come from), else the quantized file itself, for a model that exists only quantized (an
    int8 TFLite for a microcontroller, a dynamically quantized ONNX): its own answers are then
    what every other variant and the golden records are measured by."""
    fp32 = [m for m in models if m.precision == "fp32"]
    pool = fp32 or models
    onnx = [m for m in pool if m.runtime == "onnxruntime"]
    return (onnx or pool)[0]


def _preprocess(
    reference: SourceModel, logical: LogicalModel, options: PackageOptions
) -> Preprocess | None:
    """An image input gets [preprocess]; channels 1 → greyscale, 3 → RGB (or --bgr)."""
    shape = logical.inputs[0].shape
    if len(shape) != 4 or logical.layout is None:
        return None
    channels, height, width = (
        (shape[1], shape[2], shape[3]) if logical.layout == "NCHW" else (shape[3], *shape[1:3])
    )
    if channels not in (1, 3) or -1 in (height, width):
        return None  # an open height or width: a tensor the client sizes (v2 carries the -1)
    mean = options.mean or (0.0,) * channels
    std = options.std or (1.0,) * channels
    for flag, values in (("--mean", mean), ("--std", std)):
        if len(values) != channels:
            raise PackagingError(
                f"{reference.path}: {flag} needs {channels} values for a {channels}-channel input"
            )
    if any(v == 0 for v in std):
        raise PackagingError(f"{reference.path}: --std must not contain 0")
    color = "L" if channels == 1 else ("BGR" if options.bgr else "RGB")
    resize = round(min(height, width) / 0.875) if options.crop else None
    return Preprocess(
        (height, width),
        resize,
        logical.layout,
        color,
        options.scale,
        mean,
        std,
        resize_filter=options.resize_filter or "bilinear",
    )


def _labels(
    options: PackageOptions, logical: LogicalModel, names: tuple[str, ...] | None, work: Path
) -> Path | None:
    """--labels, else the class names the model's own metadata carries (written to a file)."""
    if options.labels is None and names is not None:
        classes = logical.outputs[0].shape[-1]
        if logical.task == "classification" and classes > 0 and len(names) != classes:
            return None  # metadata for something else (a recogniser's alphabet): not labels
        path = work / "labels.txt"
        path.write_text("".join(f"{n}\n" for n in names), encoding="utf-8")
        return path
    if options.labels is None:
        return None
    if not options.labels.is_file():
        raise PackagingError(f"--labels {options.labels}: no such file")
    count = len(_label_names(options.labels))
    classes = logical.outputs[0].shape[-1]
    if logical.task == "classification" and classes > 0 and count != classes:
        raise PackagingError(
            f"--labels {options.labels}: {count} labels, but the model has "
            f"{classes} classes: pass a file with one label per class"
        )
    return options.labels


def _label_names(labels: Path | None) -> tuple[str, ...]:
    if labels is None:
        return ()
    return tuple(
        line.strip() for line in labels.read_text(encoding="utf-8").splitlines() if line.strip()
    )


def _variants(
    models: list[SourceModel],
    reference: SourceModel,
    source: Path,
    stem: str,
    staging: Path,
    logical: LogicalModel,
    preprocess: Preprocess | None,
    labels: Path | None,
    options: PackageOptions,
    progress: Progress,
) -> tuple[list[Made], list[Failed]]:
    """Made variants from the fp32 ONNX, then every other source passed through as it is."""
    made: list[Made] = []
    failed: list[Failed] = []
    derive = reference.runtime == "onnxruntime"
    quantized_source = reference.precision != "fp32"  # no fp32 original: the file itself
    if derive:
        wanted = options.variants or DEFAULT_VARIANTS + (("int8",) if options.calibration else ())
        calibration = None
        if "int8" in wanted and not quantized_source:
            if options.calibration is None:
                raise PackagingError(
                    f"{reference.path}: an int8 variant needs calibration "
                    "data: pass --calibration DIR (images) or FILE.npz"
                )
            names = _label_names(labels)
            samples = load_samples(
                options.calibration,
                preprocess,
                "--calibration",
                options.max_images,
                names,
                logical.inputs[0].shape,
            )
            calibration = {logical.inputs[0].name: samples.inputs}
        made, failed = make_variants(
            source,
            stem,
            staging,
            wanted,
            calibration,
            method=options.calibration_method,
            reduce_range=reduce_range_for(options.reduce_range),
            progress=progress,
            quantized_source=quantized_source,
        )
    for model in models:
        if model is reference and derive:
            continue
        if logical.layout == "NHWC" and model.layout == "NCHW":
            raise PackagingError(
                f"{model.path}: an NCHW file cannot serve the NHWC input of "
                f"{reference.path.name}: list the NCHW file first"
            )
        files = []
        for path in model.files:
            target = staging / f"{stem}.{model.precision}{path.suffix}"
            shutil.copyfile(path, target)
            files.append(target)
        made.append(
            Made(model.runtime, model.precision, tuple(files), "cpu", "source", layout=model.layout)
        )
    seen: dict[str, Made] = {}
    for item in made:
        key = f"{item.runtime}/{item.precision}"
        if key in seen:
            raise PackagingError(
                f"{item.files[0].name}: a second {key} variant (one file per runtime and precision)"
            )
        seen[key] = item
    return made, failed


def _heldout(
    options: PackageOptions,
    preprocess: Preprocess | None,
    logical: LogicalModel,
    labels: Path | None,
) -> tuple[Samples, str]:
    names = _label_names(labels)
    if len(logical.inputs) > 1 or not logical.batches or preprocess is None:
        # not one batched image: token ids, bytes, audio, several inputs (packaging.feeds)
        given = options.heldout or options.calibration
        what = f"--heldout {given}" if given else "seeded noise (no --heldout given)"
        return tensor_samples(given, "--heldout", logical, options.max_images), what
    for flag, source in (("--heldout", options.heldout), ("--calibration", options.calibration)):
        if source is not None:
            shape = logical.inputs[0].shape
            samples = load_samples(source, preprocess, flag, options.max_images, names, shape)
            return samples, f"{flag} {source}"
    shape = tuple(1 if d == -1 else d for d in logical.inputs[0].shape)
    noise = np.random.default_rng(0).standard_normal((32, *shape[1:])).astype(np.float32)
    return Samples(noise, None), "seeded noise (no --heldout or --calibration given)"


def _training_data(
    options: PackageOptions,
    preprocess: Preprocess | None,
    logical: LogicalModel,
    labels: Path | None,
) -> Samples | None:
    """--calibration's rows for --prune-epochs or --distil-from (never the validation data)."""
    trains = options.prune_epochs or options.distil_from is not None
    if not trains or options.calibration is None:  # check_prune, check_distil: both or none
        return None
    names, shape = _label_names(labels), logical.inputs[0].shape
    limit = options.max_images
    return load_samples(options.calibration, preprocess, "--calibration", limit, names, shape)


def _golden(
    logical: LogicalModel,
    inputs: np.ndarray,
    reference: dict[str, np.ndarray],
    outputs: dict[str, dict[str, np.ndarray]],
    reports: list[VariantReport],
    head: Head | None = None,
) -> dict:
    """Rows every kept variant answers like the reference, and the task's record for them:
    a detector with a head gets boxes, with tolerances from the kept variants' own error."""
    names = [t.name for t in logical.outputs]
    kept = [outputs[r.key] for r in reports if r.kept and r.key in outputs]
    if not logical.batches:  # one feed, the request the health check sends as it is
        chosen, error = one_feed_record(reference, kept, 0)
        atol = max(1e-5, 2.0 * error)
        record = golden_record(logical.task, names, chosen, top_k=5, atol=atol, rtol=1e-3)
        return {"rows": np.arange(1), "record": record}
    if head is not None:
        rows, boxes = golden_boxes_record(head, names, reference, kept, GOLDEN_ROWS)
        return {"rows": rows, "record": boxes}
    rows = np.arange(len(inputs))
    if logical.task == "classification":
        expected = ranked(reference[names[0]], 1)[:, 0]
        agree = np.ones(len(inputs), dtype=bool)
        for answer in kept:
            agree &= ranked(answer[names[0]], 1)[:, 0] == expected
        rows = rows[agree] if agree.any() else rows
    rows = rows[:GOLDEN_ROWS]
    chosen = {n: reference[n][rows] for n in names}
    errors = [float(np.max(np.abs(a[n][rows] - chosen[n]))) for a in kept for n in names]
    atol = max(1e-5, 2.0 * max(errors, default=0.0))
    record = golden_record(logical.task, names, chosen, top_k=5, atol=atol, rtol=1e-3)
    return {"rows": rows, "record": record}
