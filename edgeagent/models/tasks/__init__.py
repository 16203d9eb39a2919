"""What a package's ``task`` means for its golden set and its health check.

A classifier is checked by its classes (an int8 variant may move a score but must keep the
class among the top k); any other task — detection, segmentation, a plain tensor model — by its
output tensors, within a tolerance recorded next to them when the package was built. The golden
file holds the inputs plus what :func:`golden_record` returns for the task.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from edgeagent.models.tasks import classification, tensors

TASK_NAMES = ("classification", "detection", "segmentation", "tensor")


def golden_record(
    task: str, output_names: Sequence[str], outputs: Mapping[str, np.ndarray], **options: float
) -> dict[str, np.ndarray]:
    """The arrays a golden file stores beside the inputs for ``task``.

    ``outputs`` are the reference (fp32) answers to the golden inputs. Options: ``top_k`` for
    classifiers; ``atol`` and ``rtol`` for the other tasks.
    """
    if task == "classification":
        return classification.record(outputs[output_names[0]], int(options.get("top_k", 5)))
    _known(task)
    return tensors.record(
        [outputs[name] for name in output_names],
        atol=float(options.get("atol", 1e-4)),
        rtol=float(options.get("rtol", 1e-3)),
    )


def golden_problem(
    task: str,
    output_names: Sequence[str],
    golden: Mapping[str, np.ndarray],
    outputs: Mapping[str, np.ndarray],
    top_k: int = 5,
) -> str:
    """Why ``outputs`` (the answers to the golden inputs) break the golden record, or ""."""
    if task == "classification":
        return classification.problem(golden, outputs[output_names[0]], top_k)
    _known(task)
    return tensors.problem(golden, [outputs[name] for name in output_names], output_names)


def _known(task: str) -> None:
    if task not in TASK_NAMES:
        raise ValueError(f"unknown task {task!r} (one of {', '.join(TASK_NAMES)})")
