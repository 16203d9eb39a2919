"""Classifiers: the golden record is the reference's top-k classes per input.

Checking classes rather than scores is what lets one golden file serve every variant: int8
moves the scores, and a healthy int8 model still ranks the reference class near the top.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np


def ranked(scores: np.ndarray, k: int) -> np.ndarray:
    """Class indices of each row, best first, ``k`` of them."""
    rows = np.asarray(scores, dtype=np.float32).reshape(len(scores), -1)
    return np.argsort(-rows, axis=-1, kind="stable")[:, : max(1, min(k, rows.shape[-1]))]


def record(scores: np.ndarray, top_k: int) -> dict[str, np.ndarray]:
    best = ranked(scores, top_k)
    return {"top1": best[:, 0].astype(np.int64), "topk": best.astype(np.int64)}


def problem(golden: Mapping[str, np.ndarray], scores: np.ndarray, top_k: int) -> str:
    if "top1" not in golden:
        return "the golden file lacks top1 (the expected class of each input)"
    expected = np.asarray(golden["top1"]).reshape(-1)
    if len(scores) != len(expected):
        return f"{len(scores)} answers for {len(expected)} golden inputs"
    best = ranked(scores, top_k)
    wrong = int(np.sum(~np.any(best == expected[:, None], axis=-1)))
    if wrong:
        count = len(expected)
        return f"{wrong} of {count} golden inputs lost their expected class from the top {top_k}"
    return ""
