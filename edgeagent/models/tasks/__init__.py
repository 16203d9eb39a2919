"""What a package's ``task`` means for its golden set and its health check.

A classifier is checked by its classes (an int8 variant may move a score but must keep the
class among the top k); a detector whose golden file holds boxes by its decoded boxes, matched
by IoU (see ``boxes``); any other task — or a detector recorded as raw tensors — by its output
tensors, within a tolerance recorded next to them when the package was built. The golden
file holds the inputs plus what :func:`golden_record` returns for the task.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from edgeagent.models.names import TASK_NAMES
from edgeagent.models.tasks import boxes, classification, tensors
from edgeagent.models.tasks.detection import Detections

Decoder = Callable[[Mapping[str, np.ndarray]], Sequence[Detections]]


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
    decode: Decoder | None = None,
) -> str:
    """Why ``outputs`` (the answers to the golden inputs) break the golden record, or "".

    ``decode`` turns a detector's outputs into one ``Detections`` per golden input; a golden
    file that holds boxes needs it.
    """
    if task == "classification":
        return classification.problem(golden, outputs[output_names[0]], top_k)
    if task == "detection" and boxes.is_record(golden):
        if decode is None:
            return "the golden file holds boxes, but the package has no [detection] head"
        return boxes.problem(golden, decode(outputs))
    _known(task)
    return tensors.problem(golden, [outputs[name] for name in output_names], output_names)


def _known(task: str) -> None:
    if task not in TASK_NAMES:
        raise ValueError(f"unknown task {task!r} (one of {', '.join(TASK_NAMES)})")
