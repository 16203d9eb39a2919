"""Knowledge distillation: a small PyTorch student learns a teacher package's soft outputs.

``edgeagent package student.py:make --distil-from TEACHER_PACKAGE --distil-epochs N
--calibration DATA`` trains ``make()``'s network (from its ``--weights`` or from scratch) to
answer like the teacher, then packages the student like any source. The teacher is a package,
not a network: its fp32 ONNX runs under onnxruntime on every training batch, so a model built
by any framework can teach, and the hub can distil the model its fleet serves.

The loss is Hinton's: the KL divergence between the student's and the teacher's outputs, both
softened by ``TEMPERATURE`` (the runner-up classes carry what the teacher knows about which
digits look alike), scaled by T². Rows with a label (``--calibration`` class folders, or an
``.npz`` whose ``labels`` are ≥ 0) add a cross-entropy term of equal weight; a label of -1
marks a row only the teacher labels (the hub's unreviewed field samples). Image-shaped rows
are shifted by up to two pixels each epoch and the teacher sees the same shifted rows, so the
student learns the teacher's answer on inputs no file holds. Pruning's fine-tuning is the same
loop, with the unpruned network as its teacher (``packaging.pruning``).

The student is judged against the teacher on ``--heldout``: top-1 of each (or agreement, for
unlabelled data) and batch-1 speed on this CPU (medians of alternating rounds), all recorded in
validation.json under "distillation". Its variants are then validated against its own fp32 as
any package's are.

Torch is a build-time tool: this runs where ``file.py:factory`` is exported (``.venv-build``).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgeagent.models.package import PackageError, load_package
from edgeagent.packaging.errors import PackagingError

TEMPERATURE = 4.0  # softens the teacher's outputs so the runner-up classes teach too
LEARNING_RATE = 3e-3  # the one cycle's peak
BATCH = 32
MAX_SHIFT = 2  # pixels an image-shaped row moves at most, each way
UNLABELLED = -1  # a row's label when only the teacher says what it is
ROUNDS = 5  # alternating timing rounds (reference, candidate, reference, …)
RUNS_PER_ROUND = 20

Teacher = Callable[[Any], Any]  # a batch tensor → its logits tensor


def teach(
    model: Any,
    teacher: Teacher,
    inputs: np.ndarray,
    labels: np.ndarray | None,
    epochs: int,
    temperature: float = TEMPERATURE,
) -> None:
    """``epochs`` of AdamW on one learning-rate cycle: ``teacher``'s softened outputs distilled
    into ``model``, plus cross-entropy on the rows whose label is not ``UNLABELLED``."""
    import torch
    import torch.nn.functional as F

    generator = torch.Generator().manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE, weight_decay=0.01)
    steps = epochs * -(-len(inputs) // BATCH)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, LEARNING_RATE, total_steps=steps)
    x = torch.from_numpy(np.ascontiguousarray(inputs, dtype=np.float32))
    y = torch.from_numpy(
        np.full(len(inputs), UNLABELLED, np.int64) if labels is None else labels.astype(np.int64)
    )
    t = temperature
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=generator)
        for start in range(0, len(x), BATCH):
            rows = order[start : start + BATCH]
            if len(rows) >= 2:  # BatchNorm needs two rows to train
                batch = shifted(x[rows], generator)
                with torch.no_grad():
                    taught = F.softmax(teacher(batch) / t, dim=1)
                out = model(batch)
                student = F.log_softmax(out / t, dim=1)
                loss = t * t * F.kl_div(student, taught, reduction="batchmean")
                known = y[rows] != UNLABELLED
                if bool(known.any()):
                    loss = 0.5 * loss + 0.5 * F.cross_entropy(out[known], y[rows][known])
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
            schedule.step()
    model.eval()


def shifted(batch: Any, generator: Any) -> Any:
    """Image-shaped rows (N, C, H, W of at least 16×16) moved by up to ``MAX_SHIFT`` pixels
    each way, the edge zero-filled; any other tensor as it is."""
    import torch
    import torch.nn.functional as F

    if batch.dim() != 4 or min(batch.shape[2:]) < 16:
        return batch
    m, (height, width) = MAX_SHIFT, batch.shape[2:]
    padded = F.pad(batch, (m, m, m, m))
    offsets = torch.randint(0, 2 * m + 1, (len(batch), 2), generator=generator).tolist()
    return torch.stack(
        [padded[i, :, y : y + height, x : x + width] for i, (y, x) in enumerate(offsets)]
    )


def session(path: Path, threads: int | None) -> Any:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or 0
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def answers(path: Path, inputs: np.ndarray, threads: int | None) -> np.ndarray:
    """The first output of ``path``'s network for every row, 64 rows a run."""
    run = session(path, threads)
    name = run.get_inputs()[0].name
    parts = [run.run(None, {name: inputs[i : i + 64]})[0] for i in range(0, len(inputs), 64)]
    return np.concatenate(parts).reshape(len(inputs), -1)


def accuracy(scores: np.ndarray, labels: np.ndarray | None) -> float | None:
    if labels is None:
        return None
    return 100.0 * float(np.mean(scores.argmax(1) == labels))


def speedup(reference: Path, candidate: Path, shape: tuple[int, ...], threads: int | None) -> float:
    """Reference ÷ candidate batch-1 latency here: medians of alternating rounds, so a busy
    moment slows both alike."""
    sessions = [session(reference, threads), session(candidate, threads)]
    feeds = [{s.get_inputs()[0].name: np.zeros(shape, np.float32)} for s in sessions]
    for run, feed in zip(sessions, feeds, strict=True):
        for _ in range(3):
            run.run(None, feed)  # warm-up: first runs allocate
    medians: list[list[float]] = [[], []]
    for _ in range(ROUNDS):
        for index, (run, feed) in enumerate(zip(sessions, feeds, strict=True)):
            times = []
            for _ in range(RUNS_PER_ROUND):
                tick = time.perf_counter()
                run.run(None, feed)
                times.append(time.perf_counter() - tick)
            medians[index].append(statistics.median(times))
    return statistics.median(medians[0]) / statistics.median(medians[1])


@dataclass
class DistilFigures:
    """The student against its teacher on the held-out rows, as validation.json records it."""

    teacher: str  # name and version of the teacher package
    epochs: int
    rows: int  # training rows, of which ``labelled`` carry a label
    labelled: int
    parameters: int  # the student's
    accuracy: float | None  # student top-1 on the held-out labels (None: unlabelled data)
    teacher_accuracy: float | None
    agreement: float  # student's top-1 agreement with the teacher, %
    speedup: float  # teacher batch-1 latency / student's
    seconds: float  # training time


@dataclass(frozen=True)
class DistilJob:
    """What distillation needs from the build: student, teacher, data."""

    spec: str
    weights: Path | None
    shape: tuple[int, ...]  # one input row, batch 1
    teacher_dir: Path
    epochs: int
    train: tuple[np.ndarray, np.ndarray | None]  # inputs, labels (UNLABELLED: the teacher's)
    heldout: tuple[np.ndarray, np.ndarray | None]
    threads: int | None


def distil_job(
    spec: str, options: Any, shape: tuple[int, ...], heldout: Any, train: Any
) -> DistilJob:
    """The distillation the command's options (PackageOptions) ask for."""
    return DistilJob(
        spec=spec,
        weights=options.weights,
        shape=(1, *shape[1:]),
        teacher_dir=options.distil_from,
        epochs=options.distil_epochs,
        train=(train.inputs, train.labels),
        heldout=(heldout.inputs, heldout.labels),
        threads=options.threads,
    )


def check_distil(sources: Sequence[str], options: Any) -> None:
    """Refuse a --distil-from that cannot work before any export or validation runs."""
    if options.distil_from is None:
        if options.distil_epochs:
            raise PackagingError("--distil-epochs trains a student: add --distil-from TEACHER")
        return
    if len(sources) != 1 or ".py:" not in sources[0]:
        raise PackagingError(
            "--distil-from trains a PyTorch student: the source must be one file.py:factory"
        )
    if options.prune:
        raise PackagingError("--distil-from and --prune: distil first, then prune the student")
    if options.distil_epochs < 1:
        raise PackagingError("--distil-from needs --distil-epochs N (N ≥ 1) of training")
    if options.calibration is None:
        raise PackagingError(
            "--distil-from trains on data kept apart from --heldout: pass --calibration DIR "
            "(images, class folders for labels) or FILE.npz (inputs, labels with -1 for rows "
            "only the teacher labels)"
        )
    teacher_onnx(options.distil_from)


def teacher_onnx(package_dir: Path) -> tuple[Path, str]:
    """The teacher package's fp32 ONNX and its name and version; PackagingError says why not."""
    try:
        package = load_package(package_dir)
    except PackageError as exc:
        raise PackagingError(f"--distil-from {package_dir}: {exc}") from exc
    variant = package.variant("onnxruntime", "fp32")
    if variant is None:
        raise PackagingError(
            f"--distil-from {package_dir}: {package.name} has no onnxruntime fp32 variant to "
            "teach with"
        )
    return variant.files[0], f"{package.name} {package.version}"


def onnx_teacher(path: Path, threads: int | None) -> Teacher:
    """``path``'s network as a torch-side teacher: its logits for a batch tensor. Outputs that
    already are probabilities (a softmax inside the graph) are taken back to log space."""
    import torch

    run = session(path, threads)
    name = run.get_inputs()[0].name

    def logits(batch: Any) -> Any:
        out = run.run(None, {name: batch.numpy()})[0].reshape(len(batch), -1)
        if out.min() >= 0.0 and np.allclose(out.sum(1), 1.0, atol=1e-3):
            out = np.log(np.maximum(out, 1e-8))
        return torch.from_numpy(out.astype(np.float32))

    return logits


def distil_source(
    job: DistilJob, work: Path, progress: Callable[[str], None]
) -> tuple[Path, DistilFigures]:
    """The trained student's ONNX (the network the variants are made from) and its figures."""
    from edgeagent.packaging.torch_export import export_onnx, load_factory

    teacher_path, teacher_name = teacher_onnx(job.teacher_dir)
    student = load_factory(job.spec, job.weights)
    inputs, labels = job.train
    labelled = 0 if labels is None else int(np.count_nonzero(labels != UNLABELLED))
    progress(
        f"distilling {teacher_name} into {job.spec}: {len(inputs)} rows ({labelled} labelled), "
        f"{job.epochs} epoch(s)"
    )
    started = time.perf_counter()
    teach(student, onnx_teacher(teacher_path, job.threads), inputs, labels, job.epochs)
    seconds = time.perf_counter() - started
    path = work / "student.onnx"
    export_onnx(student.eval(), np.zeros((2, *job.shape[1:]), np.float32), path, "input", "output")
    held, held_labels = job.heldout
    taught, learnt = answers(teacher_path, held, job.threads), answers(path, held, job.threads)
    if taught.shape != learnt.shape:
        raise PackagingError(
            f"the student answers {learnt.shape[1]} values a row, its teacher {taught.shape[1]}: "
            "they must share the classes (--labels as the teacher's)"
        )
    figures = DistilFigures(
        teacher=teacher_name,
        epochs=job.epochs,
        rows=len(inputs),
        labelled=labelled,
        parameters=sum(p.numel() for p in student.parameters()),
        accuracy=accuracy(learnt, held_labels),
        teacher_accuracy=accuracy(taught, held_labels),
        agreement=100.0 * float(np.mean(learnt.argmax(1) == taught.argmax(1))),
        speedup=speedup(teacher_path, path, job.shape, job.threads),
        seconds=round(seconds, 1),
    )
    top1 = (
        ""
        if figures.accuracy is None
        else f"top-1 {figures.accuracy:.2f} % (teacher {figures.teacher_accuracy:.2f} %), "
    )
    progress(
        f"student: {figures.parameters} parameters, {top1}agreement {figures.agreement:.2f} %, "
        f"{figures.speedup:.2f}x the teacher's speed, trained in {seconds:.0f} s"
    )
    return path, figures


def figures_json(figures: DistilFigures) -> dict[str, Any]:
    return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(figures).items()}
