"""Write a package's model.toml (the schema of ``edgeagent/models/package.py``) and hashes."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from zoo.convert import INPUT_NAME
from zoo.specs import ModelSpec


@dataclass(frozen=True)
class VariantFiles:
    runtime: str
    precision: str
    files: tuple[str, ...]
    layout: str | None = None


def sha256(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def _value(value: object) -> str:
    """A TOML literal; JSON's string escapes and number syntax are valid TOML."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


def _table(header: str, fields: dict[str, object]) -> list[str]:
    lines = [header] if header else []
    lines += [f"{key} = {_value(value)}" for key, value in fields.items() if value is not None]
    return [*lines, ""]


def write_manifest(
    root: Path,
    spec: ModelSpec,
    output_shape: list[int],
    variants: list[VariantFiles],
    golden: str | None = "golden.npz",
) -> None:
    """model.toml naming every variant with the SHA-256 of each of its files.

    ``output_shape`` is ``[-1, classes]`` for a classifier, ``[-1, cells, 4 + classes]`` for
    the detector; a classifier gets a ``[postprocess]`` table, a detector its ``[detection]``.
    """
    lines = _table(
        "",
        {
            "name": spec.name,
            "version": spec.version,
            "task": spec.task,
            "description": spec.description,
            "labels": "labels.txt",
            "golden": golden,
        },
    )
    shape = [-1, spec.channels, spec.size, spec.size]
    lines += _table(
        "[[inputs]]", {"name": INPUT_NAME, "dtype": "float32", "shape": shape, "layout": "NCHW"}
    )
    lines += _table(
        "[[outputs]]", {"name": spec.output_name, "dtype": "float32", "shape": output_shape}
    )
    lines += _table(
        "[preprocess]",
        {
            "size": [spec.size, spec.size],
            "resize": spec.resize,
            "layout": "NCHW",
            "color": spec.color,
            "scale": 1.0 / 255.0,
            "mean": list(spec.mean),
            "std": list(spec.std),
            "letterbox": spec.letterbox or None,
        },
    )
    if spec.detection is None:
        lines += _table("[postprocess]", {"softmax": True, "top_k": min(5, output_shape[-1])})
    else:
        lines += _table("[detection]", dict(spec.detection))
    lines += _table(
        "[serving]",
        {
            "max_batch_size": spec.max_batch_size,
            "max_queue_delay_ms": spec.max_queue_delay_ms,
            "cache_size": 0,
        },
    )
    for variant in variants:
        hashes = ", ".join(
            f"{json.dumps(f)} = {json.dumps(sha256(root / f))}" for f in variant.files
        )
        lines += _table(
            "[[variant]]",
            {
                "runtime": variant.runtime,
                "precision": variant.precision,
                "files": list(variant.files),
                "layout": variant.layout,
            },
        )
        lines.insert(len(lines) - 1, f"sha256 = {{ {hashes} }}")
    (root / "model.toml").write_text("\n".join(lines), encoding="utf-8")
