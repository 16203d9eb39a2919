"""Each variant against the fp32 reference on held-out inputs; which ones the package keeps.

Figures per variant: max absolute and cosine error and relative error of the outputs (any
task), top-1 agreement and top-5 recall of the reference class (classifiers), accuracy when
labels are known, mAP@0.5 against fp32's boxes and the score range (detectors with a known
head), mean mask IoU (segmentation), and the batch-1 latency and peak RSS measured in a process
of its own (packaging/measure.py). ``judge`` keeps or drops each by its task's figure
(packaging/task_checks.py says which and why).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from edgeagent.models.tasks.classification import ranked
from edgeagent.packaging.errors import PackagingError
from edgeagent.packaging.task_checks import (
    Head,
    Thresholds,
    detection_map,
    mean_mask_iou,
    relative_error,
    score_problem,
)
from edgeagent.packaging.variants import Made, Progress
from edgeagent.runtimes.facts import NATIVE_SUFFIXES, weights_file

DEFAULT_TIMING_RUNS = 30  # batch-1 runs whose median is a variant's latency


@dataclass
class VariantReport:
    runtime: str
    precision: str
    device_class: str
    how: str
    kept: bool = True
    reason: str = ""
    max_abs_error: float | None = None
    cosine_min: float | None = None
    top1_agreement: float | None = None  # percent of rows whose top-1 equals the reference's
    top5_recall: float | None = None  # percent of rows whose reference top-1 is in the top 5
    accuracy: float | None = None  # percent, with a labelled held-out set
    relative_error: float | None = None  # largest per-row |variant - fp32| / |fp32|
    map_vs_fp32: float | None = None  # detectors: mAP@0.5 of its boxes against fp32's boxes
    fp32_boxes: int | None = None  # how many boxes fp32 found on the held-out data
    score_range: list[float] | None = None  # detectors: lowest and highest candidate score
    score_issue: str = ""  # detectors: why the score range is wrong, "" when it is not
    mask_iou: float | None = None  # segmentation: mean IoU of its masks against fp32's
    timing: dict = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.runtime}/{self.precision}"


def run_isolated(
    made: Made | Path,
    runtime: str,
    names: tuple[list[str], list[str]],
    inputs: Path,
    workdir: Path,
    layout: str | None,
    threads: int | None,
    precision: str = "fp32",
    repeats: int = DEFAULT_TIMING_RUNS,
) -> tuple[dict, dict[str, np.ndarray]] | str:
    """Answers and timing of one file set in a child process, or the reason it failed
    (``precision``: a reference file's own, where it is not fp32)."""
    if isinstance(made, Made):
        files = made.files
    else:  # the reference file, with the weights file its format keeps beside it
        weights = weights_file(made)
        files = (made, weights) if weights is not None else (made,)
    tag = f"{runtime}-{made.precision if isinstance(made, Made) else 'reference'}"
    job = {
        "runtime": runtime,
        "precision": made.precision if isinstance(made, Made) else precision,
        "files": [str(f) for f in files],
        "layout": layout,
        "threads": threads,
        "input_names": names[0],
        "output_names": names[1],
        "inputs": str(inputs),
        "outputs": str(workdir / f"{tag}.npz"),
        "repeats": repeats,
    }
    job_file = workdir / f"{tag}.json"
    job_file.write_text(json.dumps(job), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(
        [sys.executable, "-m", "edgeagent.packaging.measure", str(job_file)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
        return (lines[-1] if lines else f"exit status {done.returncode}")[:400]
    timing = json.loads(done.stdout.strip().splitlines()[-1])
    with np.load(workdir / f"{tag}.npz") as data:
        outputs = {name: data[f"out_{i}"] for i, name in enumerate(names[1])}
    return timing, outputs


def compare(
    report: VariantReport,
    reference: dict[str, np.ndarray],
    outputs: dict[str, np.ndarray],
    classifier: bool,
    labels: np.ndarray | None,
    task: str = "tensor",
    head: Head | None = None,
) -> None:
    """Fill the error figures of ``report`` from the variant's outputs, and its task's."""
    ref = np.concatenate([reference[n].reshape(len(reference[n]), -1) for n in reference], 1)
    got = np.concatenate([outputs[n].reshape(len(outputs[n]), -1) for n in reference], 1)
    report.max_abs_error = float(np.max(np.abs(ref - got)))
    ref, got = ref.astype(np.float64), got.astype(np.float64)
    norms = np.linalg.norm(ref, axis=1) * np.linalg.norm(got, axis=1)
    cosine = np.sum(ref * got, axis=1) / np.maximum(norms, 1e-300)
    cosine[np.all(ref == got, axis=1)] = 1.0  # equal rows agree, even all-zero ones
    report.cosine_min = float(np.min(cosine))
    report.relative_error = relative_error(ref, got)
    names = list(reference)
    if task == "detection" and head is not None:
        report.map_vs_fp32, report.fp32_boxes = detection_map(head, names, reference, outputs)
        low, high = head.score_range(outputs, names)
        report.score_range = [low, high]
        report.score_issue = score_problem(head.score_range(reference, names), (low, high))
    elif task == "segmentation":
        report.mask_iou = mean_mask_iou(reference[names[0]], outputs[names[0]])
    if classifier:
        first = next(iter(reference))
        expected = ranked(reference[first], 1)[:, 0]
        best = ranked(outputs[first], 5)
        report.top1_agreement = 100.0 * float(np.mean(best[:, 0] == expected))
        report.top5_recall = 100.0 * float(np.mean(np.any(best == expected[:, None], axis=1)))
        if labels is not None:
            report.accuracy = 100.0 * float(np.mean(best[:, 0] == labels))


def judge(
    reports: Sequence[VariantReport],
    max_top1_drop: float,
    thresholds: Thresholds | None = None,
) -> None:
    """Leave out each variant that fails its task's rule, with the figure and the rule.

    Classifiers: top-1 agreement more than ``max_top1_drop`` points off. Detectors with a
    known head: mAP against fp32's boxes under ``min_map``, or scores outside 0..1 where fp32's
    are inside. Segmentation: mean mask IoU under ``min_mask_iou``. Everything else (and a
    detector whose fp32 found no box to match): cosine under ``min_cosine`` or relative error
    over ``max_relative_error``.
    """
    rules = thresholds or Thresholds()
    for report in reports:
        if report.kept and report.max_abs_error is not None:
            reason = _failure(report, max_top1_drop, rules)
            if reason:
                report.kept, report.reason = False, reason


def _failure(report: VariantReport, max_top1_drop: float, rules: Thresholds) -> str:
    if report.top1_agreement is not None:
        drop = 100.0 - report.top1_agreement
        if drop > max_top1_drop:
            return (
                f"top-1 agreement {report.top1_agreement:.2f} % is {drop:.2f} points below "
                f"fp32 (--max-top1-drop {max_top1_drop:g})"
            )
        return ""
    if report.score_issue:
        return report.score_issue
    if report.map_vs_fp32 is not None:
        if report.map_vs_fp32 < rules.min_map:
            return (
                f"mAP@0.5 against fp32's {report.fp32_boxes} boxes is {report.map_vs_fp32:.4f}, "
                f"{100 * (1 - report.map_vs_fp32):.2f} points lost (--min-map {rules.min_map:g})"
            )
        return ""
    if report.mask_iou is not None:
        if report.mask_iou < rules.min_mask_iou:
            return (
                f"mean mask IoU against fp32 is {report.mask_iou:.4f} "
                f"(--min-mask-iou {rules.min_mask_iou:g})"
            )
        return ""
    if report.cosine_min is not None and report.cosine_min < rules.min_cosine:
        return (
            f"cosine similarity to fp32 falls to {report.cosine_min:.4f} "
            f"(--min-cosine {rules.min_cosine:g})"
        )
    if report.relative_error is not None and report.relative_error > rules.max_relative_error:
        return (
            f"relative error against fp32 reaches {report.relative_error:.4f} "
            f"(--max-relative-error {rules.max_relative_error:g})"
        )
    return ""


def validate(
    made: Sequence[Made],
    reference: Path,
    names: tuple[list[str], list[str]],
    inputs: Path,
    workdir: Path,
    *,
    classifier: bool,
    labels: np.ndarray | None,
    logical_layout: str | None,
    task: str = "tensor",
    head: Head | None = None,
    threads: int | None,
    progress: Progress,
    reference_precision: str = "fp32",
    repeats: int = DEFAULT_TIMING_RUNS,
) -> tuple[list[VariantReport], dict[str, np.ndarray], dict, dict[str, dict[str, np.ndarray]]]:
    """Reports per variant (kept or not, and why), the reference's outputs and timing, and
    each variant's outputs by key."""
    what = f"{reference_precision} reference"
    progress(f"validation: {what} {reference.name}")
    runtime = NATIVE_SUFFIXES[reference.suffix]
    ref_run = run_isolated(
        reference, runtime, names, inputs, workdir, None, threads, reference_precision, repeats
    )
    if isinstance(ref_run, str):
        raise PackagingError(f"{reference}: the {what} does not run here: {ref_run}")
    ref_timing, ref_outputs = ref_run
    if classifier and labels is not None:
        first = next(iter(ref_outputs))
        ref_timing["accuracy"] = 100.0 * float(
            np.mean(ranked(ref_outputs[first], 1)[:, 0] == labels)
        )
    reports = []
    answers: dict[str, dict[str, np.ndarray]] = {}
    for item in made:
        progress(f"validation: {item.runtime}/{item.precision} ({item.device_class})")
        report = VariantReport(item.runtime, item.precision, item.device_class, item.how)
        layout = item.layout if item.layout not in (None, logical_layout or "NCHW") else None
        result = run_isolated(
            item, item.runtime, names, inputs, workdir, layout, threads, repeats=repeats
        )
        if isinstance(result, str):
            elsewhere = item.device_class != "cpu"
            report.kept = elsewhere
            report.reason = (
                f"not validated here (meant for {item.device_class}): {result}"
                if elsewhere
                else f"does not run here: {result}"
            )
        else:
            report.timing, outputs = result
            answers[report.key] = outputs
            compare(report, ref_outputs, outputs, classifier, labels, task, head)
        reports.append(report)
    return reports, ref_outputs, ref_timing, answers


def as_json(reports: Sequence[VariantReport]) -> list[dict]:
    return [asdict(r) for r in reports]
