"""Calibration and held-out data: a directory of images (ImageFolder layout gives labels) or an
``.npz`` of ready tensors (``inputs``, optional ``labels``).

Images go through the package's own ``[preprocess]``, the very transform the agent applies to
``/classify`` requests, so calibration and validation see what served requests will see.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgeagent.models.package import Preprocess
from edgeagent.models.preprocess import ImageError, preprocess_image
from edgeagent.packaging.errors import PackagingError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")


@dataclass(frozen=True)
class Samples:
    """Input tensors (batch first) and, for a labelled set, one class index per row; a model
    with several inputs has the others' arrays in ``extra`` (see ``packaging.feeds``)."""

    inputs: np.ndarray
    labels: np.ndarray | None
    extra: dict[str, np.ndarray] = field(default_factory=dict)


def load_samples(
    source: Path,
    preprocess: Preprocess | None,
    flag: str,
    limit: int,
    labels: tuple[str, ...],
    shape: tuple[int, ...],
) -> Samples:
    """Read ``source`` for ``flag`` (--calibration or --heldout), at most ``limit`` rows, as
    tensors of the model's input ``shape`` (-1 = the batch)."""
    if source.suffix == ".npz" and source.is_file():
        return _conform(_from_npz(source, flag, limit), shape, f"{flag} {source}")
    if not source.is_dir():
        raise PackagingError(f"{flag} {source}: neither a directory of images nor an .npz file")
    if preprocess is None:
        raise PackagingError(
            f"{flag} {source}: images need the model's preprocessing; this input is not an "
            "image tensor, so pass an .npz with an 'inputs' array instead"
        )
    classes = tuple(sorted(p.name for p in source.iterdir() if p.is_dir()))
    files = sorted(p for p in source.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise PackagingError(f"{flag} {source}: no .jpg/.jpeg/.png images in it")
    files = files[:: max(1, len(files) // limit)][:limit]  # spread over every class
    tensors = []
    for path in files:
        try:
            tensors.append(preprocess_image(path.read_bytes(), preprocess))
        except ImageError as exc:
            raise PackagingError(f"{flag} {path}: {exc}") from exc
    inputs = np.concatenate(tensors)
    if not classes:
        return Samples(inputs, None)
    index = {name: _class_index(name, i, labels) for i, name in enumerate(classes)}
    rows = np.asarray([index[p.relative_to(source).parts[0]] for p in files], dtype=np.int64)
    return Samples(inputs, rows)


def _conform(samples: Samples, shape: tuple[int, ...], where: str) -> Samples:
    """Tensors in the model's layout: an NCHW array for an NHWC input (or back) is transposed."""
    have = tuple(samples.inputs.shape[1:])
    want = tuple(shape[1:])
    if have == want:
        return samples
    if len(want) == 3 and have == (want[2], want[0], want[1]):
        return Samples(samples.inputs.transpose(0, 2, 3, 1).copy(), samples.labels)
    if len(want) == 3 and have == (want[1], want[2], want[0]):
        return Samples(samples.inputs.transpose(0, 3, 1, 2).copy(), samples.labels)
    raise PackagingError(
        f"{where}: inputs of shape {list(have)} do not fit the model's input {list(want)}"
    )


def _class_index(directory: str, position: int, labels: tuple[str, ...]) -> int:
    """A class directory names its label (``cat``) or its index (``3``); else its sort order."""
    if directory in labels:
        return labels.index(directory)
    if directory.isdigit():
        return int(directory)
    return position


def _from_npz(source: Path, flag: str, limit: int) -> Samples:
    try:
        return _read_npz(source, flag, limit)
    except (OSError, ValueError, EOFError) as exc:  # not an .npz, cut short, pickled objects
        raise PackagingError(f"{flag} {source}: not a readable .npz of arrays: {exc}") from exc


def _read_npz(source: Path, flag: str, limit: int) -> Samples:
    with np.load(source, allow_pickle=False) as data:
        if "inputs" not in data.files:
            raise PackagingError(f"{flag} {source}: the .npz needs an 'inputs' array")
        inputs = data["inputs"][:limit].astype(np.float32)
        labels = data["labels"][:limit].astype(np.int64) if "labels" in data.files else None
    return Samples(inputs, labels)
