"""Edit a model package's ``model.toml`` through its parsed form, never through its text.

A ``str.replace`` on the file is silently a no-op once the template it expects changes, and the
test then passes without testing anything. These helpers load the TOML, change named fields,
and raise ``KeyError`` when a field they are asked to change does not exist.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from edgeagent._toml import tomllib
from edgeagent.models.manifest_writer import write_table
from edgeagent.models.package import file_sha256, load_package

# A field path: "serving.max_batch_size", or a tuple where a key holds dots or an index is needed:
# ("variant", 0, "sha256", "tiny.fp32.onnx").
FieldPath = str | Sequence[str | int]


def read_model_toml(package_dir: Path) -> dict[str, Any]:
    """The package's model.toml as a dict, ready to be changed and written back."""
    return tomllib.loads((package_dir / "model.toml").read_text())


def write_model_toml(package_dir: Path, data: Mapping[str, Any]) -> None:
    """Write ``data`` as the package's model.toml, unchecked: tests write broken ones too."""
    write_table(package_dir, data)


def _split(path: FieldPath) -> list[str | int]:
    if isinstance(path, str):
        return [int(part) if part.isdigit() else part for part in path.split(".")]
    return list(path)


def set_fields(package_dir: Path, changes: Mapping[FieldPath, Any]) -> dict[str, Any]:
    """Set existing fields of model.toml (``{"serving.max_batch_size": 16}``); returns the data.

    Raises ``KeyError`` (or ``IndexError``) naming the path when a field or any table above it
    is missing: a helper that changes nothing must not let a test pass.
    """
    data = read_model_toml(package_dir)
    for path, value in changes.items():
        *parents, last = _split(path)
        node: Any = data
        for part in parents:
            node = node[part]
        if isinstance(node, list):
            node[int(last)] = value
        elif last not in node:
            raise KeyError(f"model.toml has no field {path!r}")
        else:
            node[last] = value
    write_model_toml(package_dir, data)
    return data


def add_field(package_dir: Path, path: FieldPath, value: Any) -> None:
    """Add a field that must not exist yet (``golden = "golden.npz"``) to an existing table."""
    data = read_model_toml(package_dir)
    *parents, last = _split(path)
    node: Any = data
    for part in parents:
        node = node[part]
    if last in node:
        raise KeyError(f"model.toml already has {path!r}")
    node[last] = value
    write_model_toml(package_dir, data)


def keep_variants(package_dir: Path, keep: Callable[[Mapping[str, Any]], bool]) -> list[dict]:
    """Drop every ``[[variant]]`` for which ``keep`` is false; raises if none is left."""
    data = read_model_toml(package_dir)
    kept = [variant for variant in data["variant"] if keep(variant)]
    if not kept:
        raise KeyError(f"{package_dir / 'model.toml'} has no variant that fits")
    data["variant"] = kept
    write_model_toml(package_dir, data)
    return kept


def rehash_files(package_dir: Path) -> None:
    """Write the current sha256 of every variant file whose digest model.toml records."""
    data = read_model_toml(package_dir)
    changes: dict[FieldPath, str] = {}
    for index, variant in enumerate(data["variant"]):
        for name in variant.get("sha256", {}):
            changes[("variant", index, "sha256", name)] = file_sha256(package_dir / name)
    if not changes:
        raise KeyError(f"{package_dir / 'model.toml'} records no sha256 to update")
    set_fields(package_dir, changes)


def pinned_package(
    package_dir: Path, precision: str, target: Path, runtime: str = "onnxruntime"
) -> Path:
    """A copy of the package that offers only its ``runtime`` ``precision`` variant.

    The daemon picks the device's best candidate (LiteRT or OpenVINO may rank first); the
    comparison is one variant against itself, so the served package has nothing else to pick.
    model.toml keeps every table except the other [[variant]] blocks; files are copied (a
    package refuses symlinks that point outside it).
    """
    package = load_package(package_dir)
    chosen = package.variant(runtime, precision)
    if chosen is None:
        raise SystemExit(f"{package_dir} has no {runtime} {precision} variant")
    others = {f for v in package.variants if v is not chosen for f in v.files}
    target.mkdir(parents=True)
    for path in package.root.iterdir():
        if path.is_file() and path not in others:
            shutil.copyfile(path, target / path.name)
    keep_variants(target, lambda v: v["runtime"] == runtime and v["precision"] == precision)
    return target
