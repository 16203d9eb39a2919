"""The one writer of ``model.toml``: a typed description in, the text ``load_package`` reads out.

The packager, the zoo builder, the test and bench helpers all make packages; were each to spell
the TOML itself, a schema change would have five places to miss. They describe a package with
``Manifest`` (built from the reader's own types: ``TensorSpec``, ``Preprocess``, …) and call
``write_manifest``, which hashes every variant file, writes the file and reads it back with
``load_package``: a package this writes is one the agent accepts, or the producer hears why at
once rather than when a device refuses it.

The TOML itself comes from ``dumps``, a serializer limited to what model.toml holds (strings,
integers, finite floats, booleans, lists, tables; a list of tables at the top level is an array
of tables, deeper tables are inline). It is written here rather than taken from tomli-w because
the agent's runtime dependencies and the zoo builder's environment need nothing new for it; its
output is checked against the stdlib reader by a property test (tests/unit/test_manifest_writer).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeagent.models.detection_head import DetectionHead
from edgeagent.models.package import (
    ModelPackage,
    Postprocess,
    Preprocess,
    ServingHints,
    TensorSpec,
    file_sha256,
    load_package,
)
from edgeagent.models.sequence_table import SequenceSpec

MANIFEST = "model.toml"
_BARE_KEY = re.compile(r"\A[A-Za-z0-9_-]+\Z")
_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\f": "\\f",
    "\r": "\\r",
}
_INT64 = range(-(2**63), 2**63)


@dataclass(frozen=True)
class VariantFiles:
    """One ``[[variant]]``: its files by name inside the package (the writer hashes them)."""

    runtime: str
    precision: str
    files: tuple[str, ...]
    layout: str | None = None  # the file's input layout where it differs from the package's


@dataclass(frozen=True)
class Manifest:
    """What a producer knows about its package; ``None`` leaves a field to the reader's default."""

    name: str
    version: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    variants: tuple[VariantFiles, ...]
    task: str = "classification"
    description: str = ""
    labels: str | None = None  # file names inside the package
    golden: str | None = None
    preprocess: Preprocess | None = None
    postprocess: Postprocess | None = None
    serving: ServingHints | None = None
    detection: DetectionHead | None = None
    anchors: str | None = None  # an SSD head's anchors: a .npy file inside the package
    sequence: SequenceSpec | None = None  # a stateful model: how its state is kept
    # Besides model.toml and the variant files, what devices need; the files named above
    # (labels, golden, anchors) are added. None: undeclared (the hub ships every other file).
    device_files: tuple[str, ...] | None = None


def manifest_table(manifest: Manifest, root: Path) -> dict[str, Any]:
    """``manifest`` as model.toml's tables, each variant file hashed from ``root``."""
    table: dict[str, Any] = {
        "name": manifest.name,
        "version": manifest.version,
        "task": manifest.task,
        "description": manifest.description or None,
        "labels": manifest.labels,
        "golden": manifest.golden,
        "device_files": _device_files(manifest),
        "inputs": [_tensor(t) for t in manifest.inputs],
        "outputs": [_tensor(t) for t in manifest.outputs],
    }
    if manifest.preprocess is not None:
        pre = manifest.preprocess
        table["preprocess"] = {
            "size": list(pre.size),
            "resize": pre.resize,
            "layout": pre.layout,
            "color": pre.color,
            "scale": pre.scale,
            "mean": list(pre.mean),
            "std": list(pre.std),
            "letterbox": pre.letterbox or None,  # absent is the reader's False
            "resize_filter": None if pre.resize_filter == "bilinear" else pre.resize_filter,
        }
    if manifest.postprocess is not None:
        table["postprocess"] = {
            "softmax": manifest.postprocess.softmax,
            "top_k": manifest.postprocess.top_k,
        }
    if manifest.detection is not None:
        head = manifest.detection
        table["detection"] = {
            "style": head.style,
            "box_format": head.box_format,
            "normalized": head.normalized,
            "objectness": head.objectness,
            "activation": head.activation,
            "background": head.background,
            "variances": list(head.variances),
            "first_class_id": head.first_class_id or None,  # absent is the reader's 0
            "score_threshold": head.score_threshold,
            "iou_threshold": head.iou_threshold,
            "max_detections": head.max_detections,
            "anchors": manifest.anchors,
        }
    if manifest.serving is not None:
        table["serving"] = {
            "max_batch_size": manifest.serving.max_batch_size,
            "max_queue_delay_ms": manifest.serving.max_queue_delay_ms,
            "cache_size": manifest.serving.cache_size,
        }
    if manifest.sequence is not None:
        table["sequence"] = manifest.sequence.table()
    table["variant"] = [
        {
            "runtime": v.runtime,
            "precision": v.precision,
            "files": list(v.files),
            "layout": v.layout,
            "sha256": {name: file_sha256(root / name) for name in v.files},
        }
        for v in manifest.variants
    ]
    return table


def _device_files(manifest: Manifest) -> list[str] | None:
    """The declared device files with every file model.toml names, once each, in order."""
    if manifest.device_files is None:
        return None
    named = (manifest.labels, manifest.golden, manifest.anchors, *manifest.device_files)
    return list(dict.fromkeys(name for name in named if name))


def _tensor(tensor: TensorSpec) -> dict[str, Any]:
    return {
        "name": tensor.name,
        "dtype": tensor.dtype,
        "shape": list(tensor.shape),
        "layout": tensor.layout,
    }


def write_manifest(root: Path, manifest: Manifest) -> ModelPackage:
    """Write ``root/model.toml`` for ``manifest`` and return the package as the agent reads it.

    Raises ``PackageError`` (naming the field) when the result is not a package ``load_package``
    accepts: the variant files must be in ``root`` already.
    """
    write_table(root, manifest_table(manifest, root))
    return load_package(root)


def write_table(root: Path, table: Mapping[str, Any]) -> None:
    """Write ``table`` as ``root/model.toml`` as it is, valid or not (tests build broken ones)."""
    (root / MANIFEST).write_text(dumps(table), encoding="utf-8")


def dumps(table: Mapping[str, Any]) -> str:
    """TOML text for ``table``; ``None`` values are left out (the reader's default applies).

    Raises ``TypeError`` or ``ValueError`` naming the key for a value TOML cannot hold as the
    reader would read it back (a NaN, a lone surrogate, an integer beyond 64 bits, an object).
    """
    plain = {k: v for k, v in table.items() if v is not None}
    tables = {k: v for k, v in plain.items() if _is_table(v) or _is_table_array(v)}
    lines = [f"{_key(k)} = {_value(v, k)}" for k, v in plain.items() if k not in tables]
    for key, value in tables.items():
        for body in [value] if _is_table(value) else value:
            header = f"[{_key(key)}]" if _is_table(value) else f"[[{_key(key)}]]"
            lines += ["", header]
            lines += [
                f"{_key(k)} = {_value(v, f'{key}.{k}')}" for k, v in body.items() if v is not None
            ]
    return "\n".join(lines).lstrip("\n") + "\n"


def _is_table(value: Any) -> bool:
    return isinstance(value, Mapping)


def _is_table_array(value: Any) -> bool:
    is_list = isinstance(value, (list, tuple))
    return is_list and bool(value) and all(isinstance(item, Mapping) for item in value)


def _key(key: Any) -> str:
    if not isinstance(key, str):
        raise TypeError(f"model.toml keys are strings, got {type(key).__name__} {key!r}")
    return key if _BARE_KEY.match(key) else _string(key, key)


def _value(value: Any, where: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        if value not in _INT64:
            raise ValueError(f"model.toml: {where}: {value} does not fit TOML's 64-bit integers")
        return int.__repr__(value)
    if isinstance(value, float):  # numpy's float64 too: float's own repr, not numpy's
        if not math.isfinite(value):
            raise ValueError(f"model.toml: {where}: {value} is not a finite number")
        return float.__repr__(value)
    if isinstance(value, str):
        return _string(value, where)
    if isinstance(value, Mapping):
        items = [
            f"{_key(k)} = {_value(v, f'{where}.{k}')}" for k, v in value.items() if v is not None
        ]
        return "{ " + ", ".join(items) + " }" if items else "{}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v, f"{where}[{i}]") for i, v in enumerate(value)) + "]"
    raise TypeError(f"model.toml: {where}: cannot write {type(value).__name__} {value!r}")


def _string(text: str, where: str) -> str:
    """A TOML basic string: quotes, backslashes and control characters escaped."""
    out = []
    for char in text:
        code = ord(char)
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\u{code:04X}")
        elif 0xD800 <= code <= 0xDFFF:
            raise ValueError(f"model.toml: {where}: a lone surrogate cannot be written as UTF-8")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'
