"""Whether a classifier's scores already are probabilities, so softmax is not applied twice.

A classifier exported with its Softmax (PaddleOCR's direction classifier, most Keras models)
answers probabilities; softmax over them again flattens them (0.925 served as 0.450). The
reference's answers on the validation data decide: every score in [0, 1] and every row
summing to 1 means probabilities. ``--softmax`` / ``--no-softmax`` overrule the judgement.
"""

from __future__ import annotations

import numpy as np

SUM_TOLERANCE = 1e-3  # float32 softmax rows sum to 1 within ~1e-6; logits almost never do


def already_probabilities(scores: np.ndarray, tolerance: float = SUM_TOLERANCE) -> bool:
    """True when every row of ``scores`` [rows, …, classes] is a probability distribution."""
    values = np.asarray(scores, dtype=np.float64)
    if values.size == 0 or values.ndim < 1 or not np.all(np.isfinite(values)):
        return False
    rows = values.reshape(-1, values.shape[-1])
    if rows.shape[-1] < 2 or np.any(rows < 0) or np.any(rows > 1 + tolerance):
        return False
    return bool(np.all(np.abs(rows.sum(axis=1) - 1.0) <= tolerance))


def wants_softmax(forced: bool | None, scores: np.ndarray) -> bool:
    """``[postprocess] softmax``: the flag when given, else unless the scores are probabilities."""
    if forced is not None:
        return forced
    return not already_probabilities(scores)


EMBEDDING_MIN_WIDTH = 64  # narrower unlabelled outputs stay classifiers (scores of a few classes)


def looks_like_embedding(values: np.ndarray) -> bool:
    """True when an unlabelled "classifier" output is better served as a feature vector.

    Wide (``EMBEDDING_MIN_WIDTH`` or more) and not a distribution: with no label to name any
    of its columns, ranking them as classes would only invent a classifier (a 1280-wide
    pooled feature served as 1280 unnamed classes). Values alone cannot tell logits from
    features, so the packager says so and ``--task classification`` or ``--labels`` keeps a
    classifier.
    """
    rows = np.asarray(values, dtype=np.float64).reshape(len(values), -1)
    if rows.size == 0 or rows.shape[-1] < EMBEDDING_MIN_WIDTH:
        return False
    return not already_probabilities(rows)
