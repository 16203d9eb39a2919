"""The inputs every health check feeds a model: sample feeds and the package's golden set.

Three places run a model before it takes traffic — the hardware probe, the registry's warm-up
and the updater's health check — and all three must feed it the same thing, so the recipe lives
here once.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial

import numpy as np

from edgeagent.models.detector import decode_batch
from edgeagent.models.package import ModelPackage
from edgeagent.models.tasks import golden_problem


class GoldenError(ValueError):
    """The package's golden file cannot be read or lacks an input or the expected classes."""


@dataclass(frozen=True)
class GoldenSet:
    """Golden inputs (a batch per input tensor) and what the package's task expects of them:
    the top-1 class of each row for a classifier, boxes for a detector with a known head,
    reference tensors and a tolerance otherwise."""

    package: ModelPackage
    feeds: dict[str, np.ndarray]
    record: dict[str, np.ndarray]

    @property
    def top1(self) -> np.ndarray | None:
        """A classifier's expected class per row (None for other tasks)."""
        value = self.record.get("top1")
        return None if value is None else np.asarray(value).reshape(-1)

    def problem(self, outputs: Mapping[str, np.ndarray], top_k: int) -> str:
        """Why ``outputs`` (the answers to ``feeds``) break the golden record, or "".

        The task decides how: classes in the top k, boxes matched by IoU (a detector's golden
        boxes, decoded with its own head), or tensors within the recorded tolerance.
        """
        package = self.package
        names = [spec.name for spec in package.outputs]
        decode = None
        if package.detection is not None and package.preprocess is not None:
            decode = partial(decode_batch, package)
        return golden_problem(package.task, names, self.record, outputs, top_k, decode)


def sample_feeds(package: ModelPackage) -> dict[str, np.ndarray]:
    """One batch-1 input per tensor the package declares, with plausible values.

    Varied values in [-2, 2] rather than zeros, because some delegates special-case all-zero
    input; a fixed pattern, so every check of one package sees the same input, and not
    ``numpy.random``, which would stay loaded in the daemon for this alone (1.5 MB).
    An integer input that has golden inputs takes the first of them: its integers mean
    something no pattern stands for (Silero VAD refuses a sample rate of 0); so does an input
    with an open dimension other than the batch (an audio length, a text line's width), whose
    size 1 the model may refuse (a 1-sample spectrogram has no frame).
    """
    golden = _golden_samples(package)
    feeds = {}
    for spec in package.inputs:
        shape = tuple(1 if d == -1 else d for d in spec.shape)
        dtype = np.dtype(spec.dtype)
        if spec.name in golden:
            feeds[spec.name] = golden[spec.name]
        elif dtype.kind == "f":
            pattern = 2 * np.sin(np.arange(math.prod(shape)) * 2.39996)
            feeds[spec.name] = pattern.reshape(shape).astype(dtype)
        else:
            feeds[spec.name] = np.zeros(shape, dtype=dtype)
    return feeds


def _golden_samples(package: ModelPackage) -> dict[str, np.ndarray]:
    """The first golden sample of each integer input and of each input with an open
    dimension other than the batch (none without a golden file)."""
    batches = all(len(s.shape) > 0 and s.shape[0] == -1 for s in package.inputs)
    wanted = [
        s
        for s in package.inputs
        if np.dtype(s.dtype).kind != "f" or -1 in (s.shape[1:] if batches else s.shape)
    ]
    if not wanted or package.golden is None:
        return {}
    alias = {package.inputs[0].name: "inputs"} if len(package.inputs) == 1 else {}
    try:
        with np.load(package.golden) as golden:
            found = {}
            for spec in wanted:
                for key in (spec.name, alias.get(spec.name)):
                    if key in golden.files:
                        found[spec] = golden[key]
                        break
    except (OSError, ValueError):
        return {}  # load_golden reports an unusable file where it matters
    feeds = {}
    for spec, value in found.items():
        value = value[:1] if batches else value  # a batch of rows, or one whole feed
        fits = value.ndim == len(spec.shape) and all(
            want in (-1, got) for want, got in zip(spec.shape, value.shape, strict=True)
        )
        if fits:
            feeds[spec.name] = value.astype(spec.dtype)
    return feeds


def load_golden(package: ModelPackage) -> GoldenSet | None:
    """The package's golden set, or None when it ships none; GoldenError when it is unusable.

    The file holds one array per input name (``inputs`` for a single-input model) and the
    task's record (``top1`` for a classifier; see ``edgeagent.models.tasks``).
    """
    if package.golden is None:
        return None
    try:
        with np.load(package.golden) as golden:
            data = {key: golden[key] for key in golden.files}
    except (OSError, ValueError) as exc:
        raise GoldenError(f"{package.golden.name} cannot be read: {exc}") from exc
    if "inputs" in data and len(package.inputs) == 1:
        data[package.inputs[0].name] = data.pop("inputs")
    missing = [s.name for s in package.inputs if s.name not in data]
    if package.task == "classification" and "top1" not in data:
        missing.append("top1")
    if missing:
        raise GoldenError(f"{package.golden.name} lacks {', '.join(missing[:3])}")
    feeds = {s.name: data.pop(s.name).astype(s.dtype) for s in package.inputs}
    return GoldenSet(package, feeds, data)
