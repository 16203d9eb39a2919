"""Typed config sections: a frozen dataclass per TOML table, validated field by field.

Each part of the agent declares its own section next to its code (engine/settings.py,
hardware/settings.py …); ``edgeagent.config`` only composes them. Every field has a default, a
one-line description and a unit (``setting()``), so an empty file (or none) is a valid
configuration, ``edgeagent config show`` and the README's reference come from the code, and
every error names ``[section] key``.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import difflib
import types
import typing
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration value that cannot be used; the message names the section and key.

    ``problems`` holds every problem found (``edgeagent config check`` names them all); the
    message is those problems, one a line.
    """

    def __init__(self, *problems: str) -> None:
        super().__init__("\n".join(problems))
        self.problems: list[str] = list(problems)


def did_you_mean(
    unknown: Iterable[str], known: Iterable[str], show: Callable[[str], str] = str
) -> str:
    """`` (did you mean X?)`` naming the known name closest to each unknown one, or ``""``.

    Most unknown keys, fields, options and sub-commands are typos of a real one; naming it
    saves the reader a trip through the list of every known name. The text is ready to append
    to a message; ``show`` formats each name (``repr`` where the message quotes names, as
    argparse's do).
    """
    candidates = list(known)
    pairs = [
        (name, close[0])
        for name in unknown
        if (close := difflib.get_close_matches(name, candidates, n=1))
    ]
    if not pairs:
        return ""
    if len(pairs) == 1:
        return f" (did you mean {show(pairs[0][1])}?)"
    return " (did you mean " + ", ".join(f"{show(m)} for {show(n)}" for n, m in pairs) + "?)"


def setting(default: Any, description: str, unit: str = "", *, secret: bool = False) -> Any:
    """A settings field with its default, a one-line description and its unit ("" = none).

    ``secret``: the value is a credential, which ``edgeagent config show`` never prints.
    """
    metadata = {"description": description, "unit": unit, "secret": secret}
    return dataclasses.field(default=default, metadata=metadata)


def computed_setting(factory: Callable[[], Any], description: str, unit: str = "") -> Any:
    """A settings field whose default is computed at load time (a directory, an empty list)."""
    return dataclasses.field(
        default_factory=factory, metadata={"description": description, "unit": unit}
    )


# While set, require() records its problem here instead of raising (see collecting()).
_collected: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar(
    "_collected", default=None
)


@contextlib.contextmanager
def collecting() -> Iterator[list[str]]:
    """Inside, load_section() and require() gather every problem instead of stopping at one."""
    problems: list[str] = []
    token = _collected.set(problems)
    try:
        yield problems
    finally:
        _collected.reset(token)


def _problem(message: str) -> None:
    """Record ``message`` when collecting, else raise it."""
    problems = _collected.get()
    if problems is None:
        raise ConfigError(message)
    problems.append(message)


def _describe(kind: Any) -> str:
    origin = get_origin(kind)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(kind))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in get_args(kind) if a is not type(None))
    if origin is list:
        return f"a list, each {_describe(get_args(kind)[0])}"
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
    cross-field rules and raises ConfigError. Inside ``collecting()``, every unknown key, bad
    value and failed rule is recorded and the section is built from the values that were valid.
    """
    if table is None:
        table = {}
    if not isinstance(table, dict):
        _problem(f"[{where}] must be a table, got {table!r}")
        table = {}
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(table) - set(fields))
    if unknown:
        _problem(unknown_keys(where, unknown, fields))
    values = {}
    for name in fields:
        if name in table:
            try:
                values[name] = _convert(hints[name], table[name], f"[{where}] {name}")
            except ConfigError as exc:
                _problem(str(exc))
    instance = cls(**values)
    validate = getattr(instance, "validate", None)
    if callable(validate):
        validate()
    return instance


def unknown_keys(where: str, unknown: Iterable[str], known: Iterable[str]) -> str:
    """The problem of keys a ``[where]`` table does not take, with a close match when one is."""
    names, known = sorted(unknown), sorted(known)
    return (
        f"[{where}] unknown key(s) {', '.join(names)}{did_you_mean(names, known)}; "
        f"known keys: {', '.join(known)}"
    )


def require(condition: bool, section: str, key: str, problem: str) -> None:
    """Raise ConfigError for ``[section] key`` unless ``condition`` holds (for validate()).

    Inside ``collecting()`` the problem is recorded and validation goes on to the next rule.
    """
    if not condition:
        _problem(f"[{section}] {key}: {problem}")


@dataclasses.dataclass(frozen=True)
class KeyDoc:
    """One key of a section as ``edgeagent config show`` and the README reference list it."""

    key: str
    kind: str  # "an integer", "one of 'ranked', 'fastest'" …
    default: Any  # the default value, computed now for computed settings
    computed: bool  # the default depends on the machine (directories, host name)
    unit: str
    description: str
    secret: bool = False  # a credential: shown as set or unset, never its value


def describe_section(cls: type) -> list[KeyDoc]:
    """Every key of settings class ``cls`` with its type, default, unit and description.

    Raises TypeError for a field declared without ``setting()``/``computed_setting()``, so an
    undocumented key cannot be added (the reference test fails first).
    """
    hints = typing.get_type_hints(cls)
    docs = []
    for f in dataclasses.fields(cls):
        if "description" not in f.metadata:
            raise TypeError(f"{cls.__name__}.{f.name}: declare it with setting(default, text)")
        computed = f.default is dataclasses.MISSING
        factory = f.default_factory
        default = factory() if computed and callable(factory) else f.default
        docs.append(
            KeyDoc(
                key=f.name,
                kind=_describe(hints[f.name]),
                default=default,
                computed=computed and factory not in (list, dict),
                unit=f.metadata["unit"],
                description=f.metadata["description"],
                secret=f.metadata.get("secret", False),
            )
        )
    return docs
