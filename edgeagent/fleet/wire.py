"""Typed JSON: one frozen dataclass describes a message, and gives its parser, its writer and
its JSON Schema, so the three can never disagree.

Why not a library: pydantic or msgspec would do it, but neither is a runtime dependency and a
device must not carry one for five small messages. The types a message may use are few: str,
int, float (finite), bool, ``X | None``, ``Literal[...]``, ``list[X]``, ``dict[str, X]``, unions
of scalars, and nested dataclasses. A field with a default may be absent; fields nobody declared
are tolerated (ignored, or kept in a ``rest`` field, below); a declared field of the wrong type
is refused with a ``MessageError`` naming it: ``state report: models.tiny.active_version: must be
a string, got 3``.

A dict field whose metadata has ``rest=True`` collects the top-level keys the dataclass does not
declare (free-form step details such as a canary's figures) and is written back flattened.

Signed documents (release manifests) are stricter than device messages: every field is required
or explicitly optional, an unknown one is refused (a criterion the device cannot check must not
be skipped silently), strings match an anchored pattern, integers lie in a range, lists are
bounded. ``Reader`` (at the end) reads them by those rules, so the manifests hold no type checks
of their own and every manifest refuses the same fault in the same words.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import types
from collections.abc import Callable, Collection, Mapping
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints
from urllib.parse import urlsplit

T = TypeVar("T")
Scalar = Union[str, int, float, bool, None]  # noqa: UP007 (a runtime value, read by the walker)
REST = "rest"  # field metadata: this dict takes every undeclared top-level key
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


class MessageError(ValueError):
    """A message whose declared field has the wrong type, or lacks a required one."""

    def __init__(self, what: str, path: str, problem: str) -> None:
        self.what, self.path, self.problem = what, path, problem
        super().__init__(f"{what}: {path}: {problem}" if path else f"{what}: {problem}")


def doc(text: str, *, rest: bool = False) -> dict[str, Any]:
    """A field's metadata: its documentation (it goes into the JSON Schema) and whether it is
    the ``rest`` field: ``field(default="", metadata=doc("why, for machines"))``."""
    return {"doc": text, REST: rest}


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def _fields(cls: type) -> tuple[dataclasses.Field[Any], ...]:
    return dataclasses.fields(cls)


# ---- parsing -------------------------------------------------------------------------------


def parse(hint: type[T], data: Any, what: str) -> T:
    """``data`` (decoded JSON) as ``hint``; MessageError naming the first wrong field."""
    result: T = _parse(hint, data, what, "")
    return result


def _got(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _key_path(path: str, key: str) -> str:
    step = key if _IDENTIFIER.match(key) else f"[{key!r}]"
    if not path:
        return step
    return f"{path}.{step}" if not step.startswith("[") else path + step


def _parse(hint: Any, value: Any, what: str, path: str) -> Any:
    origin = get_origin(hint)
    if dataclasses.is_dataclass(hint):
        return _parse_object(hint, value, what, path)
    if origin in (Union, types.UnionType):
        return _parse_union(get_args(hint), value, what, path)
    if origin is Literal:
        choices = get_args(hint)
        if isinstance(value, str) and value in choices:
            return value
        names = ", ".join(repr(c) for c in choices)
        raise MessageError(what, path, f"must be one of {names}, got {_got(value)}")
    if origin is list:
        if not isinstance(value, list):
            raise MessageError(what, path, f"must be a list, got {_got(value)}")
        (inner,) = get_args(hint)
        return [_parse(inner, v, what, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise MessageError(what, path, f"must be an object, got {_got(value)}")
        inner = get_args(hint)[1]
        return {k: _parse(inner, v, what, _key_path(path, k)) for k, v in value.items()}
    return _parse_scalar(hint, value, what, path)


def _parse_scalar(hint: Any, value: Any, what: str, path: str) -> Any:
    if hint is str and isinstance(value, str):
        return value
    if hint is bool and isinstance(value, bool):
        return value
    if hint is type(None) and value is None:
        return None
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int and number and (isinstance(value, int) or float(value).is_integer()):
        return int(value)
    if hint is float and number and math.isfinite(value):
        return float(value)
    raise MessageError(what, path, f"must be {_NAMES[hint]}, got {_got(value)}")


_NAMES = {
    str: "a string",
    int: "an integer",
    float: "a finite number",
    bool: "true or false",
    type(None): "null",
}


def _parse_union(members: tuple[Any, ...], value: Any, what: str, path: str) -> Any:
    if value is None and type(None) in members:
        return None
    real = [m for m in members if m is not type(None)]
    if len(real) == 1:
        return _parse(real[0], value, what, path)
    for member in real:  # unions of scalars and containers: the first that fits
        try:
            return _parse(member, value, what, path)
        except MessageError:
            continue
    names = " or ".join(_describe(m) for m in members)
    raise MessageError(what, path, f"must be {names}, got {_got(value)}")


def _describe(hint: Any) -> str:
    origin = get_origin(hint)
    if origin is list:
        return "a list"
    if origin is dict or dataclasses.is_dataclass(hint):
        return "an object"
    return _NAMES.get(hint, str(hint))


def _parse_object(cls: Any, value: Any, what: str, path: str) -> Any:
    if not isinstance(value, dict):
        raise MessageError(what, path, f"must be an object, got {_got(value)}")
    hints = _hints(cls)
    values: dict[str, Any] = {}
    rest_field = None
    for f in _fields(cls):
        if f.metadata.get(REST):
            rest_field = f
            continue
        where = _key_path(path, f.name)
        if f.name in value:
            values[f.name] = _parse(hints[f.name], value[f.name], what, where)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise MessageError(what, where, "missing")
    if rest_field is not None:
        inner = get_args(hints[rest_field.name])[1]
        declared = {f.name for f in _fields(cls)}
        kept = {}
        for key, extra in value.items():
            if key in declared:
                continue
            try:  # an undeclared field is tolerated; one that is no detail is dropped
                kept[key] = _parse(inner, extra, what, _key_path(path, key))
            except MessageError:
                continue
        values[rest_field.name] = kept
    return cls(**values)


# ---- writing -------------------------------------------------------------------------------


def dump(message: Any) -> Any:
    """The JSON-ready form; a None field whose default is None is left out."""
    if dataclasses.is_dataclass(message) and not isinstance(message, type):
        out: dict[str, Any] = {}
        rest: Mapping[str, Any] = {}
        for f in _fields(type(message)):
            value = getattr(message, f.name)
            if f.metadata.get(REST):
                rest = value
            elif not (value is None and f.default is None):
                out[f.name] = dump(value)
        return {**{k: dump(v) for k, v in rest.items() if k not in out}, **out}
    if isinstance(message, dict):
        return {k: dump(v) for k, v in message.items()}
    if isinstance(message, list):
        return [dump(v) for v in message]
    return message


# ---- JSON Schema ---------------------------------------------------------------------------


def json_schema(cls: type, *, title: str, identifier: str) -> dict[str, Any]:
    """A JSON Schema (2020-12) of ``cls``: what the parser takes, written from the same types."""
    definitions: dict[str, Any] = {}
    root = _schema_of_object(cls, definitions)
    others = {k: v for k, v in definitions.items() if k != cls.__name__}
    document = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": identifier,
        "title": title,
        **root,
    }
    if others:
        document["$defs"] = dict(sorted(others.items()))
    return document


def _schema(hint: Any, definitions: dict[str, Any]) -> dict[str, Any]:
    origin = get_origin(hint)
    if dataclasses.is_dataclass(hint):
        name = hint.__name__  # type: ignore[union-attr]
        if name not in definitions:
            definitions[name] = {}  # a placeholder while its fields are walked
            definitions[name] = _schema_of_object(hint, definitions)  # type: ignore[arg-type]
        return {"$ref": f"#/$defs/{name}"}
    if origin in (Union, types.UnionType):
        return {"anyOf": [_schema(m, definitions) for m in get_args(hint)]}
    if origin is Literal:
        return {"enum": list(get_args(hint))}
    if origin is list:
        return {"type": "array", "items": _schema(get_args(hint)[0], definitions)}
    if origin is dict:
        return {"type": "object", "additionalProperties": _schema(get_args(hint)[1], definitions)}
    return {"type": _JSON_TYPES[hint]}


_JSON_TYPES = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    type(None): "null",
}


def _schema_of_object(cls: type, definitions: dict[str, Any]) -> dict[str, Any]:
    hints = _hints(cls)
    properties: dict[str, Any] = {}
    required = []
    rest: Any = True  # undeclared fields are tolerated
    for f in _fields(cls):
        schema = _schema(hints[f.name], definitions)
        if f.metadata.get("doc"):
            schema = {**schema, "description": f.metadata["doc"]}
        if f.metadata.get(REST):
            rest = {"description": f.metadata["doc"]}  # kept when a detail, else dropped
            continue
        if f.default is not dataclasses.MISSING and f.default is not None:
            schema = {**schema, "default": f.default}
        properties[f.name] = schema
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            required.append(f.name)
    schema_of_object: dict[str, Any] = {"type": "object"}
    doc = (cls.__doc__ or "").strip().split("\n\n")[0]
    if doc:
        schema_of_object["description"] = " ".join(doc.split())
    schema_of_object["properties"] = properties
    if required:
        schema_of_object["required"] = required
    schema_of_object["additionalProperties"] = rest
    return schema_of_object


# ---- reading signed documents field by field ----------------------------------------------


SHA256_HEX = re.compile(r"\A[0-9a-f]{64}\Z", re.ASCII)


def integer_in(value: Any, low: float = -math.inf, high: float = math.inf) -> int | None:
    """``value`` when it is a JSON integer (never a bool or a float) in ``low..high``."""
    if isinstance(value, int) and not isinstance(value, bool) and low <= value <= high:
        return value
    return None


def number_of(value: Any) -> float | None:
    """A JSON number (never a bool) as a float, ``inf`` for an integer beyond any float (so a
    range check refuses it); None for anything that is no number."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:
        return math.inf


def is_object(value: Any) -> bool:
    """Whether ``value`` is a decoded JSON object."""
    return isinstance(value, dict)


def text_field(value: Any) -> str | None:
    """``value`` when it is a string (a claim read before any rule is known)."""
    return value if isinstance(value, str) else None


class Reader:
    """Reads one kind of signed document by declared rules; the first field that breaks its rule
    raises ``refuse(message)``, the message naming the document, the field and the rule:
    ``manifest version: 'latest' is not an integer or MAJOR.MINOR.PATCH``.

    ``what`` names the document (``manifest``, ``agent manifest``); ``where`` names a field by
    its path (``artifact.url``, ``variants[2]``). A value is shown truncated, so a refusal of a
    hostile document stays one short line.
    """

    def __init__(self, what: str, refuse: Callable[[str], Exception]) -> None:
        self.what, self.refuse = what, refuse

    def fail(self, where: str, problem: str) -> Exception:
        """The refusal of ``where`` (empty: the whole document) for ``problem``."""
        return self.refuse(
            f"{self.what} {where}: {problem}" if where else f"{self.what}: {problem}"
        )

    def object(self, value: Any, where: str, problem: str = "must be an object") -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(where, problem)
        return value

    def fields(
        self, document: dict[str, Any], required: Collection[str], optional: Collection[str] = ()
    ) -> None:
        """Unknown-field policy of a signed document: each required field present, nothing
        outside ``required`` and ``optional``; the refusal lists both kinds of fault."""
        missing = sorted(set(required) - set(document))
        extra = sorted(set(document) - set(required) - set(optional))
        if missing or extra:
            raise self.fail(
                "",
                f"missing field(s) {', '.join(missing) or '-'}; "
                f"unknown field(s) {', '.join(extra) or '-'}",
            )

    def exact_object(self, value: Any, where: str, keys: Collection[str]) -> dict[str, Any]:
        """A nested object with exactly ``keys`` (a pinned artifact: url, size, sha256)."""
        if not isinstance(value, dict) or set(value) != set(keys):
            raise self.fail(where, f"must be an object with {', '.join(sorted(keys))}")
        return value

    def text(self, value: Any, where: str, pattern: re.Pattern[str], rule: str) -> str:
        """A string matching ``pattern`` (anchored ``\\A…\\Z``, so no trailing newline slips by)."""
        if not isinstance(value, str) or not pattern.match(value):
            raise self.fail(where, f"{str(value)[:80]!r} is not {rule}")
        return value

    def bounded_text(self, value: Any, where: str, most: int, problem: str) -> str:
        """Free text (a reason shown to people) of at most ``most`` characters."""
        if not isinstance(value, str) or len(value) > most:
            raise self.fail(where, problem)
        return value

    def digest(self, value: Any, where: str) -> str:
        """A SHA-256 digest in lowercase hex."""
        return self.text(value, where, SHA256_HEX, "64 lowercase hex digits")

    def integer(self, value: Any, where: str, low: float, high: float, rule: str) -> int:
        found = integer_in(value, low, high)
        if found is None:
            raise self.fail(where, f"{str(value)[:40]!r} is not {rule}")
        return found

    def url(self, value: Any, where: str, max_chars: int) -> str:
        """An absolute http(s) URL of at most ``max_chars`` characters."""
        short = isinstance(value, str) and len(value) <= max_chars
        parts = urlsplit(value) if short else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.netloc:
            raise self.fail(
                where,
                f"{str(value)[:80]!r} is not an http(s) URL of at most {max_chars} characters",
            )
        return str(value)

    def items(self, value: Any, where: str, low: int, high: int, problem: str) -> list[Any]:
        """A list of ``low..high`` entries (each read by the caller)."""
        if not isinstance(value, list) or not low <= len(value) <= high:
            raise self.fail(where, problem)
        return value

    def texts(
        self, value: Any, where: str, most: int, pattern: re.Pattern[str], problem: str
    ) -> tuple[str, ...]:
        """A list of at most ``most`` strings, each matching ``pattern``."""
        if not isinstance(value, list) or len(value) > most:
            raise self.fail(where, problem)
        if not all(isinstance(item, str) and pattern.match(item) for item in value):
            raise self.fail(where, problem)
        return tuple(value)

    def distinct(self, keys: list[str], where: str, problem: str) -> None:
        """Refuse a list whose entries' ``keys`` repeat (a variant or platform listed twice)."""
        if len(set(keys)) != len(keys):
            raise self.fail(where, problem)
