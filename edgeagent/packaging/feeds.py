"""Validation data of models that are not one batched image input: several inputs, a fixed
batch, inputs batched on another dimension (Silero VAD's ``state [2, batch, 128]``) or scalars.

Such data sets are a stack of whole feeds: ``--heldout FILE.npz`` holds one array per input
name whose first axis counts the samples (``input [N, 1, 512]``, ``state [N, 2, 1, 128]``,
``sr [N]``), and sample ``i`` is ``{name: array[i]}``, one request as a client sends it. A model
that batches keeps the row layout of ``packaging.images`` (sample ``i`` is ``array[i:i+1]``),
so both are one ``Samples`` with the other inputs' arrays in ``extra``.

``packaging.measure`` runs a stack of feeds one feed at a time (``STACKED`` in the feeds file
says so), and the golden set of such a model is one feed, the request the health check sends.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from edgeagent.models.package import TensorSpec
from edgeagent.packaging.errors import PackagingError
from edgeagent.packaging.images import Samples
from edgeagent.packaging.measure import STACKED
from edgeagent.packaging.options import LogicalModel

NOISE_SAMPLES = 16  # seeded samples when no data is given (float inputs only)
NOISE_OPEN_SIZE = 64  # an open dimension other than the batch, in seeded noise


def tensor_samples(source: Path | None, flag: str, logical: LogicalModel, limit: int) -> Samples:
    """The samples of ``source`` (an .npz of one array per input), else seeded noise.

    Noise is refused for integer inputs: a model's integers mean something (a sample rate, a
    token id) that no random value stands for.
    """
    if source is None:
        return _noise(logical)
    if source.suffix != ".npz" or not source.is_file():
        raise PackagingError(
            f"{flag} {source}: a model with {_what(logical)} takes an .npz of one array per "
            f"input ({', '.join(t.name for t in logical.inputs)})"
        )
    try:
        with np.load(source, allow_pickle=False) as data:
            arrays = {key: data[key] for key in data.files}
    except (OSError, ValueError, EOFError) as exc:  # not an .npz, cut short, pickled objects
        raise PackagingError(f"{flag} {source}: not a readable .npz of arrays: {exc}") from exc
    if len(logical.inputs) == 1 and "inputs" in arrays:
        arrays[logical.inputs[0].name] = arrays.pop("inputs")
    missing = [t.name for t in logical.inputs if t.name not in arrays]
    if missing:
        raise PackagingError(f"{flag} {source}: no array for input(s) {', '.join(missing)}")
    feeds = {
        t.name: _conform(arrays[t.name][:limit], t, logical.batches, f"{flag} {source}")
        for t in logical.inputs
    }
    counts = {len(a) for a in feeds.values()}
    if len(counts) != 1:
        raise PackagingError(f"{flag} {source}: the inputs' arrays hold different sample counts")
    labels = arrays.get("labels")
    first, *rest = (t.name for t in logical.inputs)
    return Samples(
        feeds[first],
        None if labels is None else labels[:limit].astype(np.int64),
        {name: feeds[name] for name in rest},
    )


def _conform(array: np.ndarray, spec: TensorSpec, batches: bool, where: str) -> np.ndarray:
    """Samples of ``spec``: rows of it (a batching model) or whole feeds (any other)."""
    sample = spec.shape[1:] if batches else spec.shape
    have = array.shape[1:]
    if len(have) != len(sample) or any(w not in (-1, h) for w, h in zip(sample, have, strict=True)):
        kind = "rows" if batches else "samples"
        raise PackagingError(
            f"{where}: array {spec.name!r} of shape {list(array.shape)} is not {kind} of the "
            f"input {list(spec.shape)} (its first axis counts the samples)"
        )
    return array.astype(spec.dtype, copy=False)


def _noise(logical: LogicalModel) -> Samples:
    integers = [t.name for t in logical.inputs if np.dtype(t.dtype).kind != "f"]
    if integers:
        raise PackagingError(
            f"input(s) {', '.join(integers)} take integers, which no random data stands for: "
            "pass --heldout FILE.npz with one array of samples per input"
        )
    rng = np.random.default_rng(0)
    feeds = {}
    for spec in logical.inputs:
        sample = spec.shape[1:] if logical.batches else spec.shape
        shape = (NOISE_SAMPLES, *(NOISE_OPEN_SIZE if d == -1 else d for d in sample))
        feeds[spec.name] = rng.standard_normal(shape).astype(spec.dtype)
    first, *rest = (t.name for t in logical.inputs)
    return Samples(feeds[first], None, {name: feeds[name] for name in rest})


def write_feeds(path: Path, logical: LogicalModel, samples: Samples) -> None:
    """The feeds file ``packaging.measure`` runs: every input's array, and whether they are a
    stack of whole feeds (run one at a time) or rows (run in batches)."""
    marker = {} if logical.batches else {STACKED: np.array(True)}
    np.savez(path, allow_pickle=False, **all_inputs(logical, samples), **marker)


def all_inputs(logical: LogicalModel, samples: Samples) -> dict[str, np.ndarray]:
    return {logical.inputs[0].name: samples.inputs, **samples.extra}


def golden_inputs(
    logical: LogicalModel, samples: Samples, rows: np.ndarray
) -> dict[str, np.ndarray]:
    """The golden file's inputs: the chosen rows (``inputs`` for one batched input, as the
    reader has always taken it), or one whole feed by input name."""
    arrays = all_inputs(logical, samples)
    if logical.batches and len(arrays) == 1:
        return {"inputs": samples.inputs[rows]}
    if logical.batches:
        return {name: array[rows] for name, array in arrays.items()}
    return {name: array[int(rows[0])] for name, array in arrays.items()}


def one_feed_record(
    reference: Mapping[str, np.ndarray], kept: Sequence[Mapping[str, np.ndarray]], row: int
) -> tuple[dict[str, np.ndarray], float]:
    """A one-feed model's golden answers (sample ``row`` of the stacked reference outputs)
    and the largest error of the kept variants on it."""
    chosen = {name: np.asarray(values[row]) for name, values in reference.items()}
    errors = [
        float(np.max(np.abs(np.asarray(answer[name][row]) - chosen[name])))
        for answer in kept
        for name in chosen
    ]
    return chosen, max(errors, default=0.0)


def _what(logical: LogicalModel) -> str:
    if len(logical.inputs) > 1:
        return f"{len(logical.inputs)} inputs"
    return "a fixed batch" if not logical.batches else "a non-image input"
