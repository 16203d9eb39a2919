"""Structured pruning of a PyTorch source (``--prune 0.3`` or ``--prune 0.2,0.4,0.6``).

Channels are removed with torch-pruning (its dependency graph keeps every layer that shares a
channel consistent: a residual add, a depthwise convolution, a BatchNorm), so the pruned
network is a smaller dense one that every runtime runs faster, unlike unstructured sparsity.
Each ratio removes that share of the channels of every prunable layer, by the L2 magnitude of
their weights; the classifier's output layer is never pruned (its channels are the classes).

A pruned network is optionally fine-tuned for a few epochs (``--prune-epochs``) on labelled
data kept apart from the validation data (``--calibration``): the unpruned network teaches it
(knowledge distillation: half the loss is the labels', half the teacher's softened outputs'),
image-shaped rows are shifted by up to two pixels, and the learning rate follows one cycle.
Labels alone for three epochs lost 3.9–5 points of a MobileNetV2's top-1 on the digits; with the
teacher, the shifts and eight epochs the 0.3 ratio ends within a point (docs: the curve). Then
each is judged like any variant: by
task on the held-out data (top-1 accuracy within ``--max-top1-drop`` points of the unpruned
network's where the data is labelled, top-1 agreement where not), and by speed here (batch-1
latency on this CPU, medians of alternating rounds against the unpruned network). The largest
ratio that passes and is at least ``MIN_SPEEDUP`` faster becomes the network the package's
variants are made from; none passing leaves the network unpruned. Every ratio's figures go to
validation.json.

Torch is a build-time tool: this runs where ``file.py:factory`` is exported (``.venv-build``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgeagent.packaging.distillation import accuracy, answers, speedup, teach
from edgeagent.packaging.errors import PackagingError

# Kept channel counts are multiples of this: CPU kernels vectorise over 8 channels (AVX2
# floats), so 0.3 of 32 channels kept as 22 would run barely faster than 32.
ROUND_TO = 8
MIN_SPEEDUP = 1.05  # below this a "faster" pruned network is within timing noise


@dataclass
class PruneFigures:
    """One ratio's outcome, as validation.json records it."""

    ratio: float
    parameters: int
    accuracy: float | None  # top-1 on the held-out labels (None: unlabelled data)
    unpruned_accuracy: float | None  # the unpruned network's, on the same rows
    agreement: float  # top-1 agreement with the unpruned network, %
    speedup: float  # unpruned batch-1 latency / pruned
    kept: bool = False
    reason: str = ""


@dataclass(frozen=True)
class PruneJob:
    """What pruning needs from the build: the network, its data and the rules."""

    spec: str
    weights: Path | None
    shape: tuple[int, ...]  # one input row, NCHW with batch 1
    ratios: tuple[float, ...]
    epochs: int
    heldout: tuple[np.ndarray, np.ndarray | None]  # inputs, labels
    finetune: tuple[np.ndarray, np.ndarray | None] | None
    max_top1_drop: float
    threads: int | None


def prune_job(
    spec: str,
    options: Any,
    shape: tuple[int, ...],
    heldout: Any,
    finetune: Any,
) -> PruneJob:
    """The pruning of ``spec`` as the command's options (PackageOptions) ask for it."""
    return PruneJob(
        spec=spec,
        weights=options.weights,
        shape=(1, *shape[1:]),
        ratios=check_ratios(options.prune),
        epochs=options.prune_epochs,
        heldout=(heldout.inputs, heldout.labels),
        finetune=None if finetune is None else (finetune.inputs, finetune.labels),
        max_top1_drop=options.max_top1_drop,
        threads=options.threads,
    )


def check_prune(sources: Sequence[str], options: Any) -> None:
    """Refuse a --prune that cannot work before any export or validation runs."""
    if not options.prune:
        if options.prune_epochs:
            raise PackagingError("--prune-epochs fine-tunes pruned networks: add --prune RATIO")
        return
    check_ratios(options.prune)
    if not any(".py:" in source for source in sources):
        raise PackagingError(
            "--prune works on PyTorch sources (file.py:factory with --weights): export-only "
            "formats carry no trainable network to remove channels from"
        )
    if options.prune_epochs < 0:
        raise PackagingError(f"--prune-epochs {options.prune_epochs}: must not be negative")
    if options.prune_epochs and options.calibration is None:
        raise PackagingError(
            "--prune-epochs fine-tunes on labelled data kept apart from --heldout: pass "
            "--calibration DIR (class folders) or FILE.npz (inputs, labels)"
        )


def check_ratios(ratios: Sequence[float]) -> tuple[float, ...]:
    """Ratios in (0, 1), each once, in ascending order; PackagingError names the flag."""
    if any(not 0 < r < 1 for r in ratios):
        raise PackagingError(f"--prune {ratios}: each ratio must be between 0 and 1 (0.3 = 30 %)")
    return tuple(sorted(set(ratios)))


def prune_source(
    job: PruneJob, reference: Path, work: Path, progress: Callable[[str], None]
) -> tuple[Path | None, list[PruneFigures]]:
    """The pruned ONNX to build variants from (None: keep the unpruned ``reference``), and
    every ratio's figures."""
    from edgeagent.packaging.torch_export import export_onnx, load_factory

    try:
        import torch_pruning  # noqa: F401 - a clear message before any work
    except ImportError as exc:
        raise PackagingError(
            "--prune needs torch-pruning in the build environment (scripts/requirements-build.txt)"
        ) from exc
    network = load_factory(job.spec, job.weights)
    inputs, labels = job.heldout
    unpruned = answers(reference, inputs, job.threads)
    base_accuracy = accuracy(unpruned, labels)
    best: tuple[Path, PruneFigures] | None = None
    figures: list[PruneFigures] = []
    for ratio in job.ratios:
        pruned = prune_network(network, job.shape, ratio)
        if job.epochs and job.finetune is not None:
            progress(f"pruning {ratio:g}: fine-tuning {job.epochs} epoch(s)")
            finetune(pruned, network, *job.finetune, job.epochs)
        path = work / f"pruned-{round(ratio * 100)}.onnx"
        sample = np.zeros((2, *job.shape[1:]), np.float32)
        export_onnx(pruned.eval(), sample, path, "input", "output")
        scores = answers(path, inputs, job.threads)
        figure = PruneFigures(
            ratio=ratio,
            parameters=sum(p.numel() for p in pruned.parameters()),
            accuracy=accuracy(scores, labels),
            unpruned_accuracy=base_accuracy,
            agreement=100.0 * float(np.mean(scores.argmax(1) == unpruned.argmax(1))),
            speedup=speedup(reference, path, job.shape, job.threads),
        )
        figure.reason = _failure(figure, base_accuracy, job.max_top1_drop)
        figure.kept = not figure.reason
        top1 = "" if figure.accuracy is None else f"top-1 {figure.accuracy:.2f} %, "
        verdict = f": left out ({figure.reason})" if figure.reason else ""
        progress(
            f"pruning {ratio:g}: {figure.parameters} parameters, {top1}agreement "
            f"{figure.agreement:.2f} %, {figure.speedup:.2f}x the unpruned speed{verdict}"
        )
        figures.append(figure)
        if figure.kept:
            best = (path, figure)
    for figure in figures:  # only the largest ratio that passed is the package's network
        figure.kept = best is not None and figure is best[1]
    return (best[0] if best else None), figures


def prune_network(network: Any, shape: tuple[int, ...], ratio: float) -> Any:
    """A copy of ``network`` with ``ratio`` of each prunable layer's channels removed."""
    import torch
    import torch_pruning as tp

    model = copy.deepcopy(network).eval()
    example = torch.zeros(shape)
    with torch.no_grad():
        classes = int(model(example).shape[-1])
    heads = [
        m for m in model.modules() if isinstance(m, torch.nn.Linear) and m.out_features == classes
    ]
    pruner = tp.pruner.MetaPruner(
        model,
        example,
        importance=tp.importance.GroupMagnitudeImportance(p=2),
        pruning_ratio=ratio,
        ignored_layers=heads,
        round_to=ROUND_TO,
    )
    pruner.step()
    return model


def finetune(
    model: Any, teacher: Any, inputs: np.ndarray, labels: np.ndarray | None, epochs: int
) -> None:
    """``epochs`` of training on labelled rows, ``teacher`` (the unpruned network) distilled
    into the pruned ``model`` (``distillation.teach``: see the module docstring)."""
    if labels is None:
        raise PackagingError(
            "--prune-epochs needs labelled fine-tuning data: pass --calibration as class "
            "folders (or an .npz with labels), kept apart from --heldout"
        )
    teacher.eval()
    teach(model, teacher, inputs, labels, epochs)


def figures_json(figures: Sequence[PruneFigures]) -> list[dict[str, Any]]:
    return [
        {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(f).items()}
        for f in figures
    ]


def _failure(figure: PruneFigures, base: float | None, max_drop: float) -> str:
    if figure.accuracy is not None and base is not None:
        if base - figure.accuracy > max_drop:
            return (
                f"top-1 {figure.accuracy:.2f} % is {base - figure.accuracy:.2f} points below the "
                f"unpruned {base:.2f} % (--max-top1-drop {max_drop:g})"
            )
    elif 100.0 - figure.agreement > max_drop:
        return f"top-1 agreement {figure.agreement:.2f} % (--max-top1-drop {max_drop:g})"
    if figure.speedup < MIN_SPEEDUP:
        return f"only {figure.speedup:.2f}x the unpruned speed here (needs {MIN_SPEEDUP:g}x)"
    return ""
