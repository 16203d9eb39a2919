"""Typed config sections: a frozen dataclass per TOML table, validated field by field.

Each part of the agent declares its own section next to its code (serving/settings.py,
hardware/settings.py …); ``edgeagent.config`` only composes them. Every field has a default, so
an empty file (or none) is a valid configuration, and every error names ``[section] key``.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration value that cannot be used; the message names the section and key."""


def _describe(kind: Any) -> str:
    origin = get_origin(kind)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(kind))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in get_args(kind) if a is not type(None))
    if origin is list:
        return f"a list of {_describe(get_args(kind)[0])}"
    if origin is dict:
        return "a table"
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}
    return names.get(kind, "a path" if kind is Path else getattr(kind, "__name__", str(kind)))


def _convert(kind: Any, value: Any, where: str) -> Any:
    origin = get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in get_args(kind) if a is not type(None)]
        for option in options:
            try:
                return _convert(option, value, where)
            except ConfigError:
                continue
        raise ConfigError(f"{where}: must be {_describe(kind)}, got {value!r}")
    if origin is Literal:
        if value not in get_args(kind):
            raise ConfigError(f"{where}: must be {_describe(kind)}, got {value!r}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{where}: must be {_describe(kind)}, got {value!r}")
        (item,) = get_args(kind)
        return [_convert(item, v, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: must be a table, got {value!r}")
        return dict(value)
    if kind is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: must be true or false, got {value!r}")
        return value
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: must be a number, got {value!r}")
        return float(value)
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: must be an integer, got {value!r}")
        return value
    if kind is str:
        if not isinstance(value, str):
            raise ConfigError(f"{where}: must be a string, got {value!r}")
        return value
    if kind is Path:
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{where}: must be a path string, got {value!r}")
        return Path(value)
    if dataclasses.is_dataclass(kind):
        return load_section(kind, value, where)  # type: ignore[arg-type]
    raise ConfigError(f"{where}: unsupported setting type {kind!r}")  # pragma: no cover


def load_section(cls: type[T], table: Any, where: str) -> T:
    """Build dataclass ``cls`` from a TOML table, refusing unknown keys and wrong types.

    After conversion the dataclass's own ``validate()`` (when it has one) checks ranges and
    cross-field rules and raises ConfigError.
    """
    if table is None:
        table = {}
    if not isinstance(table, dict):
        raise ConfigError(f"[{where}] must be a table, got {table!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(table) - set(fields))
    if unknown:
        known = ", ".join(sorted(fields))
        raise ConfigError(f"[{where}] unknown key(s) {', '.join(unknown)}; known keys: {known}")
    values = {
        name: _convert(hints[name], table[name], f"[{where}] {name}")
        for name in fields
        if name in table
    }
    instance = cls(**values)
    validate = getattr(instance, "validate", None)
    if callable(validate):
        validate()
    return instance


def require(condition: bool, section: str, key: str, problem: str) -> None:
    """Raise ConfigError for ``[section] key`` unless ``condition`` holds (for validate())."""
    if not condition:
        raise ConfigError(f"[{section}] {key}: {problem}")
