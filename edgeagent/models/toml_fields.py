"""Typed access to the tables of ``model.toml``, which comes from outside (a package someone
built, or a release): every refusal names the file, the table and the field
(``model.toml: serving.threads: must be between 1 and 256``), because on a device in a field the
message is all an operator gets.

Why not ``fleet.wire.Reader``: that reads signed JSON documents, whose refusals are outcome
codes sent to the hub; a package's faults are TOML tables with defaults, and a misspelt key
gets a "did you mean". The section readers (``package``, ``serving_hints``,
``detection_table``) share these accessors so each refuses a fault in the same words.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgeagent.sections import did_you_mean


class PackageError(ValueError):
    """A model package that cannot be used; the message names the file and the field."""


class Fields:
    """Typed accessors over one TOML table that report errors as ``file: section.key: problem``."""

    def __init__(self, source: Path, where: str, table: Any) -> None:
        self.source = source
        self.where = where
        if not isinstance(table, dict):
            self.fail(f"must be a table, got {type(table).__name__}")
        self.table: dict[str, Any] = table

    def fail(self, problem: str, key: str | None = None) -> PackageError:
        # The top-level table has no name of its own: its problems read "model.toml: problem".
        path = ".".join(part for part in (self.where, key) if part)
        raise PackageError(": ".join(part for part in (str(self.source), path, problem) if part))

    def get(self, key: str, kind: type | tuple[type, ...], default: Any = ..., *, choices=None):
        if key not in self.table:
            if default is ...:
                self.fail("missing required field", key)
            return default
        value = self.table[key]
        if isinstance(value, bool) and kind in (int, float, (int, float)):
            self.fail(f"must be {_kind_name(kind)}, got a boolean", key)
        if not isinstance(value, kind):
            self.fail(f"must be {_kind_name(kind)}, got {type(value).__name__} {value!r}", key)
        if choices is not None and value not in choices:
            self.fail(f"{value!r} is not one of {', '.join(map(str, choices))}", key)
        return value

    def unknown(self, allowed: set[str]) -> None:
        extra = sorted(set(self.table) - allowed)
        if extra:
            known = ", ".join(sorted(allowed))
            hint = did_you_mean(extra, sorted(allowed))
            self.fail(f"unknown field(s) {', '.join(extra)}{hint}; allowed: {known}")


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {int: "an integer", float: "a number", str: "a string", list: "a list", dict: "a table"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def floats(fields: Fields, key: str, default: tuple[float, ...]) -> tuple[float, ...]:
    values = fields.get(key, list, list(default))
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        fields.fail("must be a list of numbers", key)
    return tuple(float(v) for v in values)


def inside(root: Path, manifest: Path, key: str, name: str) -> Path:
    """Resolve a file named by the package and refuse anything that escapes the directory."""
    path = (root / name).resolve()
    if root not in path.parents:
        raise PackageError(f"{manifest}: {key}: {name!r} points outside the package")
    return path
