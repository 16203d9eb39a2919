"""model.toml as the packager writes it: the same schema load_package() validates."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from edgeagent.models.package import Preprocess, file_sha256
from edgeagent.packaging.options import LogicalModel
from edgeagent.packaging.variants import Made


def _value(value: Any) -> str:
    """A TOML literal for the few kinds model.toml holds (JSON strings are TOML strings)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_value(k)} = {_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"cannot write {type(value).__name__} to model.toml")


def _table(header: str, fields: dict[str, Any]) -> list[str]:
    lines = [header] if header else []
    return lines + [f"{key} = {_value(v)}" for key, v in fields.items() if v is not None] + [""]


def render(
    *,
    name: str,
    version: str,
    description: str,
    logical: LogicalModel,
    preprocess: Preprocess | None,
    labels: str | None,
    golden: str | None,
    variants: Sequence[Made],
    root: Path,
) -> str:
    """The text of model.toml for ``variants`` (files relative to ``root``)."""
    lines = _table(
        "",
        {
            "name": name,
            "version": version,
            "task": logical.task,
            "description": description,
            "labels": labels,
            "golden": golden,
        },
    )
    for tensor in logical.inputs:
        layout = logical.layout if len(tensor.shape) == 4 else None
        lines += _table(
            "[[inputs]]",
            {
                "name": tensor.name,
                "dtype": tensor.dtype,
                "shape": list(tensor.shape),
                "layout": layout,
            },
        )
    for tensor in logical.outputs:
        lines += _table(
            "[[outputs]]", {"name": tensor.name, "dtype": tensor.dtype, "shape": list(tensor.shape)}
        )
    if preprocess is not None:
        lines += _table(
            "[preprocess]",
            {
                "size": list(preprocess.size),
                "resize": preprocess.resize,
                "layout": preprocess.layout,
                "color": preprocess.color,
                "scale": preprocess.scale,
                "mean": list(preprocess.mean),
                "std": list(preprocess.std),
            },
        )
    if logical.task == "classification":
        lines += _table("[postprocess]", {"softmax": True, "top_k": 5})
    for made in variants:
        names = [str(f.relative_to(root)) for f in made.files]
        layout = made.layout if made.layout not in (None, logical.layout or "NCHW") else None
        lines += _table(
            "[[variant]]",
            {
                "runtime": made.runtime,
                "precision": made.precision,
                "files": names,
                "layout": layout,
                "sha256": {str(f.relative_to(root)): file_sha256(f) for f in made.files},
            },
        )
    return "\n".join(lines)
