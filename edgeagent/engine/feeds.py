"""Request feeds: checked against the package's inputs, merged into a batch, split back.

Every answer must belong to its own request (MLServer shipped batches answered with another
request's rows): outputs whose first dimension does not equal the batch's row count fail the
batch instead of being guessed at.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

import numpy as np

from edgeagent.engine.errors import InvalidInput
from edgeagent.models.package import TensorSpec

Feeds = Mapping[str, np.ndarray]
Answer = dict[str, np.ndarray]


def can_batch(inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> bool:
    """A model batches when every input and output has a variable first (batch) dimension."""
    return all(len(spec.shape) > 0 and spec.shape[0] == -1 for spec in (*inputs, *outputs))


def validate_feeds(
    model: str, specs: Sequence[TensorSpec], feeds: Mapping[str, np.ndarray], batching: bool
) -> tuple[int, tuple]:
    """Check the feeds against the package's inputs; return (rows, shape signature).

    The signature is every input's non-batch shape: only requests with equal signatures can be
    concatenated into one batch.
    """
    expected = [spec.name for spec in specs]
    for name in feeds:
        if name not in expected:
            raise InvalidInput(
                f"model {model!r} has no input {name!r} (inputs: {', '.join(expected)})"
            )
    rows: int | None = None
    signature = []
    for spec in specs:
        if spec.name not in feeds:
            raise InvalidInput(f"model {model!r}: input {spec.name!r} is missing")
        array = feeds[spec.name]
        where = f"model {model!r}: input {spec.name!r}"
        if not isinstance(array, np.ndarray):
            raise InvalidInput(f"{where}: expected an array, got {type(array).__name__}")
        if array.dtype != np.dtype(spec.dtype):
            raise InvalidInput(
                f"{where}: datatype is {array.dtype}, the model expects {spec.dtype}"
            )
        if array.ndim != len(spec.shape):
            raise InvalidInput(
                f"{where}: shape {list(array.shape)} has {array.ndim} dimensions, "
                f"the model expects {len(spec.shape)} ({list(spec.shape)})"
            )
        for axis, (got, want) in enumerate(zip(array.shape, spec.shape, strict=True)):
            if want != -1 and got != want:
                raise InvalidInput(
                    f"{where}: shape {list(array.shape)} does not fit {list(spec.shape)} "
                    f"(dimension {axis} is {got}, expected {want})"
                )
        if array.size == 0:
            raise InvalidInput(f"{where}: shape {list(array.shape)} holds no elements")
        if batching:
            if rows is not None and array.shape[0] != rows:
                raise InvalidInput(
                    f"{where}: batch dimension is {array.shape[0]}, other inputs have {rows}"
                )
            rows = array.shape[0]
        signature.append(array.shape[1:] if batching else array.shape)
    return (rows or 1), tuple(signature)


def concat_feeds(specs: Sequence[TensorSpec], parts: Sequence[Feeds]) -> dict[str, np.ndarray]:
    """One batch from requests of equal signature, in order (a lone request is passed as is)."""
    if len(parts) == 1:
        return dict(parts[0])
    return {spec.name: np.concatenate([p[spec.name] for p in parts]) for spec in specs}


def split_outputs(outputs: Mapping[str, np.ndarray], rows: Sequence[int]) -> list[Answer]:
    """Each request's rows of the batch output, by the row counts it was concatenated from."""
    if len(rows) == 1:
        return [dict(outputs)]
    total = sum(rows)
    for name, array in outputs.items():
        if array.ndim == 0 or array.shape[0] != total:
            raise RuntimeError(
                f"output {name!r} has shape {list(array.shape)} for a batch of {total} "
                "rows; its rows cannot be split between requests"
            )
    offsets = list(itertools.accumulate(rows, initial=0))
    return [
        {name: array[a:b] for name, array in outputs.items()}
        for a, b in itertools.pairwise(offsets)
    ]
