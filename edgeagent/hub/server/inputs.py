"""The hub's REST inputs: one schema per input, which both checks each request and is the text
of the OpenAPI document, so the document can never promise less than the server enforces.

A schema is a plain OpenAPI 3.0 schema object limited to the keywords in ``KEYWORDS``, and
``check`` enforces every one of them: a schema naming any other keyword is refused when the
document is built (a test builds it), so no constraint can be written down and then ignored.

Why these rules: without each, a hostile body gets a 500 or is silently misread. Booleans are
not integers (``true`` was release 1); an integer is ASCII digits (``٣`` was 3) within the
column it is compared with (PostgreSQL's int4 raised on 2**31); numbers are finite (``1e400``
was inf); integers are never truncated (2.7 became 2); a string holds no control character
and no lone surrogate (PostgreSQL raised on a NUL, SQLite's driver on a surrogate); and a body
is parsed by ``loads_strict`` (depth limit, no duplicate keys, no NaN). A path or query
parameter that is wrong answers 400, a body field 422, each naming the input.

This module is the checker and the document's builder; the API's own parameters and bodies,
written in these schemas, are ``api_inputs``.
"""

from __future__ import annotations

import copy
import functools
import math
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from aiohttp import web

from edgeagent.fleet.signing import VerificationError, loads_strict
from edgeagent.hub.server.settings import ServerSettings

Schema = dict[str, Any]
KEYWORDS = frozenset(
    {
        "type",
        "description",
        "default",
        "enum",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "minLength",
        "maxLength",
        "pattern",
        "items",
        "minItems",
        "maxItems",
        "properties",
        "required",
        "additionalProperties",
    }
)
# No C0 control character, DEL or lone surrogate; ECMA-262 and Python read it alike.
PRINTABLE = r"^[^\x00-\x1f\x7f\ud800-\udfff]*$"
INT4_MAX = 2**31 - 1  # an Integer column (release ids) on PostgreSQL
_INTEGER_TEXT = re.compile(r"-?[0-9]{1,40}")
_NUMBER_TEXT = re.compile(r"-?[0-9]{1,40}(\.[0-9]{1,40})?([eE][+-]?[0-9]{1,4})?")


class InputError(Exception):
    """A request input that cannot be used: answered ``{"error": message}`` with ``status``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


# ---- schema builders ------------------------------------------------------------------------


def _described(schema: Schema, description: str, default: Any) -> Schema:
    if description:
        schema["description"] = description
    if default is not None:
        schema["default"] = default
    return schema


def integer(low: int, high: int, description: str = "", default: int | None = None) -> Schema:
    return _described({"type": "integer", "minimum": low, "maximum": high}, description, default)


def number(
    low: float,
    high: float,
    description: str = "",
    default: float | None = None,
    *,
    above: bool = False,
) -> Schema:
    """A finite number in [low, high], or (low, high] when ``above``."""
    schema: Schema = {"type": "number", "minimum": low, "maximum": high}
    if above:
        schema["exclusiveMinimum"] = True
    return _described(schema, description, default)


def text(max_length: int | None, description: str = "", *, min_length: int = 0) -> Schema:
    """A string without control characters; ``max_length`` None: bounded by the body size."""
    schema: Schema = {"type": "string", "pattern": PRINTABLE}
    if max_length is not None:
        schema["maxLength"] = max_length
    if min_length:
        schema["minLength"] = min_length
    return _described(schema, description, None)


def choice(values: Sequence[str], description: str = "") -> Schema:
    return _described({"type": "string", "enum": list(values)}, description, None)


def array(items: Schema, max_items: int, description: str = "", min_items: int = 0) -> Schema:
    schema: Schema = {"type": "array", "items": items, "maxItems": max_items}
    if min_items:
        schema["minItems"] = min_items
    return _described(schema, description, None)


def obj(properties: Mapping[str, Schema], description: str = "", required: Sequence[str] = ()):
    """An object of exactly these fields: one nobody declared is refused (a typo, not a no-op)."""
    schema: Schema = {
        "type": "object",
        "properties": dict(properties),
        "additionalProperties": False,
    }
    if required:
        schema["required"] = list(required)
    return _described(schema, description, None)


def known_keywords(schema: Schema, where: str = "") -> None:
    """Raise ``ValueError`` if ``schema`` uses a keyword ``check`` does not enforce."""
    unknown = set(schema) - KEYWORDS
    if unknown:
        raise ValueError(f"schema {where or '(root)'}: unenforced keywords {sorted(unknown)}")
    if isinstance(schema.get("items"), dict):
        known_keywords(schema["items"], f"{where}[]")
    for name, inner in schema.get("properties", {}).items():
        known_keywords(inner, f"{where}.{name}")


# ---- checking -------------------------------------------------------------------------------


class _Wrong(Exception):
    def __init__(self, where: str, problem: str) -> None:
        super().__init__(problem)
        self.where = where
        self.problem = problem


def _shown(value: Any) -> str:
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    try:
        shown = repr(value)
    except ValueError:  # an integer past Python's digit limit for str()
        return "an integer of over 4300 digits"
    return shown if len(shown) <= 40 else shown[:37] + "..."


def _type_ok(kind: str, value: Any) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, {"string": str, "boolean": bool, "array": list, "object": dict}[kind])


_KINDS = {
    "integer": "an integer",
    "number": "a finite number",
    "string": "a string",
    "boolean": "true or false",
    "array": "a list",
    "object": "an object",
}


def _check(schema: Schema, value: Any, where: str) -> None:
    kind = schema.get("type")
    if kind is not None and not _type_ok(kind, value):
        raise _Wrong(where, f"must be {_KINDS[kind]}, got {_shown(value)}")
    if "enum" in schema and value not in schema["enum"]:
        names = ", ".join(str(v) for v in schema["enum"])
        raise _Wrong(where, f"must be one of {names}, got {_shown(value)}")
    if kind in ("integer", "number"):
        _check_range(schema, value, where)
    elif kind == "string":
        if len(value) > schema.get("maxLength", math.inf):
            raise _Wrong(where, f"must be at most {schema['maxLength']} characters")
        if len(value) < schema.get("minLength", 0):
            raise _Wrong(where, f"must be at least {schema['minLength']} characters")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            raise _Wrong(where, f"must not hold control characters, got {_shown(value)}")
    elif kind == "array":
        if len(value) > schema.get("maxItems", math.inf):
            raise _Wrong(where, f"must have at most {schema['maxItems']} items")
        if len(value) < schema.get("minItems", 0):
            raise _Wrong(where, f"must have at least {schema['minItems']} items")
        for i, item in enumerate(value):
            _check(schema.get("items", {}), item, f"{where}[{i}]")
    elif kind == "object":
        _check_object(schema, value, where)


def _check_range(schema: Schema, value: Any, where: str) -> None:
    try:
        as_float = float(value)
    except OverflowError:  # an integer beyond any float
        as_float = math.inf
    if not math.isfinite(as_float):
        raise _Wrong(where, f"must be a finite number, got {_shown(value)}")
    low, high = schema.get("minimum", -math.inf), schema.get("maximum", math.inf)
    below = value <= low if schema.get("exclusiveMinimum") else value < low
    over = value >= high if schema.get("exclusiveMaximum") else value > high
    if below or over:
        left = "(" if schema.get("exclusiveMinimum") else "["
        right = ")" if schema.get("exclusiveMaximum") else "]"
        raise _Wrong(where, f"must be in {left}{low:g}, {high:g}{right}, got {_shown(value)}")


def _check_object(schema: Schema, value: dict[str, Any], where: str) -> None:
    properties = schema.get("properties", {})
    prefix = f"{where}." if where else ""
    for name in schema.get("required", []):
        if name not in value:
            raise _Wrong(prefix + name, "missing")
    for name, item in value.items():
        if name in properties:
            _check(properties[name], item, prefix + name)
        elif schema.get("additionalProperties", True) is False:
            known = ", ".join(properties)
            raise _Wrong(prefix + _shown(name).strip("'"), f"unknown field (known: {known})")


def check(schema: Schema, value: Any, where: str, status: int = 422) -> Any:
    """``value`` if it satisfies ``schema``, else ``InputError`` naming ``where`` (a field path)."""
    try:
        _check(schema, value, where)
    except _Wrong as wrong:
        raise InputError(status, f"{wrong.where}: {wrong.problem}") from None
    return value


def from_text(schema: Schema, raw: str, where: str) -> Any:
    """A path or query value as the JSON type its schema names (strictly: ASCII digits, no
    ``nan``, ``inf``, ``+1`` or ``1_000``), then checked like a body field (400)."""
    kind = schema.get("type")
    value: Any = raw
    if kind == "integer":
        if not _INTEGER_TEXT.fullmatch(raw):
            raise InputError(400, f"{where}: must be an integer (ASCII digits), got {_shown(raw)}")
        value = int(raw)
    elif kind == "number":
        if not _NUMBER_TEXT.fullmatch(raw):
            raise InputError(400, f"{where}: must be a finite number, got {_shown(raw)}")
        value = float(raw)
    return check(schema, value, where, 400)


# ---- parameters and bodies of a route ------------------------------------------------------

SchemaOf = Schema | Callable[[ServerSettings], Schema]


def _resolve(schema: SchemaOf, settings: ServerSettings) -> Schema:
    return schema(settings) if callable(schema) else schema


@dataclass(frozen=True)
class Param:
    """A path or query parameter; its schema may depend on the server's limits."""

    name: str
    where: Literal["query", "path"]
    schema: SchemaOf

    def document(self, settings: ServerSettings) -> dict[str, Any]:
        schema = _resolve(self.schema, settings)
        known_keywords(schema, self.name)
        item: dict[str, Any] = {"name": self.name, "in": self.where, "schema": schema}
        if self.where == "path":
            item["required"] = True
        return item

    def read(self, request: web.Request, settings: ServerSettings) -> Any:
        """The checked value; its schema's default (None if it has none) when absent."""
        schema = _resolve(self.schema, settings)
        source = request.match_info if self.where == "path" else request.query
        raw = source.get(self.name)
        if raw is None:
            return schema.get("default")
        label = self.name if self.where == "path" else f"?{self.name}="
        return from_text(schema, raw, label)


@dataclass(frozen=True)
class Body:
    """A JSON object body. ``checked=False``: documented here, checked by the handler itself
    (a release envelope, which ``verify.check_upload`` judges as a device would)."""

    schema: SchemaOf
    required: bool = True
    checked: bool = True

    def document(self, settings: ServerSettings) -> dict[str, Any]:
        schema = _resolve(self.schema, settings)
        known_keywords(schema, "body")
        return {
            "required": self.required,
            "content": {"application/json": {"schema": schema}},
        }

    async def read(self, request: web.Request, settings: ServerSettings) -> dict[str, Any]:
        data = await request.read()
        if not data.strip() and not self.required:
            return {}
        try:
            value = loads_strict(data, "the body")
        except VerificationError as exc:
            raise InputError(400, str(exc).removeprefix("malformed: ")) from None
        if not isinstance(value, dict):
            raise InputError(400, f"the body must be a JSON object, got {_shown(value)}")
        return check(_resolve(self.schema, settings), value, "")


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
VALUES = web.RequestKey("inputs", dict)
BODY = web.RequestKey("body", dict)


@dataclass(frozen=True)
class Operation:
    """One route: what it reads, declared once for the check and for the document."""

    method: str
    path: str
    handler: Handler
    params: tuple[Param, ...] = ()
    body: Body | None = None

    def route(self, settings: ServerSettings) -> web.RouteDef:
        """The aiohttp route, whose handler runs only once every input passed."""
        handler, params, body = self.handler, self.params, self.body

        known = {p.name for p in params if p.where == "query"}

        async def checked(request: web.Request) -> web.StreamResponse:
            unknown = sorted(set(request.query) - known)
            if unknown:  # a misspelt filter would otherwise silently match everything
                names = ", ".join(f"?{n}=" for n in sorted(known)) or "none"
                raise InputError(400, f"?{_shown(unknown[0])[1:-1]}=: unknown (known: {names})")
            request[VALUES] = {p.name: p.read(request, settings) for p in params}
            if body is not None and body.checked:
                request[BODY] = await body.read(request, settings)
            return await handler(request)

        # name, docstring and a ``needs`` scope (read by auth) stay on the wrapper
        functools.update_wrapper(checked, handler)
        if self.method == "GET":
            return web.get(self.path, checked)  # and HEAD, as aiohttp adds to a GET
        return web.route(self.method, self.path, checked)


def document(
    skeleton: Mapping[str, Any], operations: Sequence[Operation], settings: ServerSettings
) -> dict[str, Any]:
    """The OpenAPI document: ``skeleton`` (summaries and answers, written by hand) with every
    operation's parameters and body filled in from ``operations``, the schemas ``route``
    checks with. Every 4xx is documented as an ``Error``."""
    result = copy.deepcopy(dict(skeleton))
    described = {(method, path) for path, item in result["paths"].items() for method in item}
    for operation in operations:
        path = re.sub(r"\{(\w+):[^}]*\}", r"{\1}", operation.path)  # aiohttp's {name:regex}
        method = operation.method.lower()
        described.discard((method, path))
        item = result["paths"][path][method]
        if "parameters" in item or "requestBody" in item:
            raise ValueError(f"{method} {path}: inputs come from inputs.py, not the skeleton")
        if operation.params:
            item["parameters"] = [p.document(settings) for p in operation.params]
        if operation.body is not None:
            item["requestBody"] = operation.body.document(settings)
        item["responses"].setdefault("4XX", {"$ref": "#/components/responses/error"})
    if described:
        raise ValueError(f"the skeleton describes operations no route has: {sorted(described)}")
    return result


def values_of(request: web.Request) -> dict[str, Any]:
    """The route's parameters, checked (``Operation.route``)."""
    return request[VALUES]


def body_of(request: web.Request) -> dict[str, Any]:
    """The route's JSON body, checked (``Operation.route``)."""
    return request[BODY]
