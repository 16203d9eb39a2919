"""Second looks at a guessed task, once the reference has answered: an unlabelled "classifier"
that answers feature vectors is an embedding, and a "detector" that ``/detect`` could not serve
(no head it decodes, or no image input) is not packaged as one.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from edgeagent.models.package import Preprocess
from edgeagent.packaging.errors import PackagingError
from edgeagent.packaging.options import LogicalModel
from edgeagent.packaging.probabilities import looks_like_embedding
from edgeagent.packaging.self_described import SelfDescribed
from edgeagent.packaging.task_checks import Head
from edgeagent.packaging.validate import VariantReport
from edgeagent.packaging.variants import Progress


def embedding_or_classifier(
    logical: LogicalModel,
    answers: dict[str, np.ndarray],
    reports: list[VariantReport],
    progress: Progress,
) -> LogicalModel:
    """A guessed classifier without labels whose answers are an embedding (``tensor``).

    Its variants are then judged as tensors (cosine, relative error), not by top-1."""
    if logical.task != "classification":
        return logical
    first = answers[logical.outputs[0].name]
    if not looks_like_embedding(first):
        return logical
    progress(
        f"output {logical.outputs[0].name!r} is {first.shape[-1]} wide, not a distribution, and "
        "no labels name its columns: packaged as an embedding (task tensor); for a classifier "
        "pass --labels FILE (or --task classification)"
    )
    for report in reports:
        report.top1_agreement = report.top5_recall = report.accuracy = None
    return replace(logical, task="tensor")


def served_as_detector(
    logical: LogicalModel,
    head: Head | None,
    preprocess: Preprocess | None,
    asked_task: str | None,
    found: SelfDescribed,
    progress: Progress,
) -> LogicalModel:
    """A ``detection`` package is one ``/detect`` serves: a head it decodes and an image input.

    A guessed detector without them is packaged as ``tensor`` (said so); one asked for with
    ``--task detection`` is refused, naming what is missing."""
    if logical.task != "detection" or (head is not None and preprocess is not None):
        return logical
    what = found.detector.what if found.detector is not None else "no detector head recognised"
    missing = "an image input" if head is not None else "a head /detect decodes"
    if asked_task == "detection":
        raise PackagingError(
            f"--task detection: the outputs are not {missing} ({what}); /detect could not "
            "serve it: pass --task tensor to serve its tensors over /v2"
        )
    progress(f"{what}: not {missing}, packaged as task tensor")
    return replace(logical, task="tensor")
