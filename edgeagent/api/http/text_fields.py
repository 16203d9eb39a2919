"""Reading the JSON bodies of the OpenAI and Ollama routes: every field checked, each refusal
naming the field.

Both APIs take a loosely typed JSON object from clients the agent did not write; a wrong type
must come back as a 400 that says which field and why (OpenAI puts the field in its error's
``param``), never as a crash deep in the engine or a silently different request. The
checks here are the shared vocabulary; ``openai_requests`` and ``ollama_requests`` say which
fields each API has.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from typing import Any

from aiohttp import web

from edgeagent.api.http.body import received_body
from edgeagent.engine.errors import InvalidInput
from edgeagent.engine.text_requests import ROLES


class FieldError(InvalidInput):
    """A 400 about one field of the request; ``param`` is its path (``messages[2].role``)."""

    def __init__(self, param: str | None, message: str) -> None:
        super().__init__(message)
        self.param = param


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_json_body(body: bytes) -> dict[str, Any]:
    """The request's JSON object; broken JSON, a non-object or NaN is a 400 saying where."""
    if not body.strip():
        raise FieldError(None, "the request body is empty: send a JSON object")
    try:
        value = json.loads(body, parse_constant=_refuse_constant)
    except UnicodeDecodeError as exc:
        raise FieldError(None, f"the request body is not UTF-8: {exc.reason}") from None
    except json.JSONDecodeError as exc:
        raise FieldError(None, f"the request body is not valid JSON: {exc}") from None
    except (ValueError, RecursionError) as exc:
        raise FieldError(None, f"the request body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise FieldError(None, "the request body must be a JSON object")
    return value


async def read_json_body(request: web.Request) -> dict[str, Any]:
    """The body read within the listener's limits (``body.received_body``), then parsed."""
    async with received_body(request, lambda declared: declared) as body:
        return parse_json_body(body)


def _type_name(value: Any) -> str:
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "an array",
        dict: "an object",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def string(body: dict[str, Any], key: str, *, param: str | None = None) -> str:
    """A required non-empty string."""
    value = body.get(key)
    name = param or key
    if value is None:
        raise FieldError(name, f"'{name}' is required")
    if not isinstance(value, str):
        raise FieldError(name, f"'{name}' must be a string, not {_type_name(value)}")
    if not value:
        raise FieldError(name, f"'{name}' must not be empty")
    return value


def optional_string(body: dict[str, Any], key: str, *, param: str | None = None) -> str | None:
    value = body.get(key)
    name = param or key
    if value is not None and not isinstance(value, str):
        raise FieldError(name, f"'{name}' must be a string, not {_type_name(value)}")
    return value


def optional_bool(
    body: dict[str, Any], key: str, default: bool, *, param: str | None = None
) -> bool:
    value = body.get(key)
    name = param or key
    if value is None:
        return default
    if not isinstance(value, bool):
        raise FieldError(name, f"'{name}' must be true or false, not {_type_name(value)}")
    return value


def optional_number(
    body: dict[str, Any], key: str, low: float, high: float, *, param: str | None = None
) -> float | None:
    """A number within [low, high], or None when absent (null counts as absent)."""
    value = body.get(key)
    name = param or key
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise FieldError(name, f"'{name}' must be a number, not {_type_name(value)}")
    if not math.isfinite(value) or not low <= value <= high:
        raise FieldError(name, f"'{name}' must be between {low:g} and {high:g}, not {value}")
    return float(value)


def optional_int(
    body: dict[str, Any], key: str, low: int, high: int | None = None, *, param: str | None = None
) -> int | None:
    """An integer ≥ ``low`` (and ≤ ``high``), or None when absent; 3.0 counts as 3."""
    value = body.get(key)
    name = param or key
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise FieldError(name, f"'{name}' must be an integer, not {_type_name(value)}")
    if value < low or (high is not None and value > high):
        bound = f"at least {low}" if high is None else f"between {low} and {high}"
        raise FieldError(name, f"'{name}' must be {bound}, not {value}")
    return value


def optional_object(body: dict[str, Any], key: str, *, param: str | None = None) -> dict[str, Any]:
    """An object, or {} when absent."""
    value = body.get(key)
    name = param or key
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise FieldError(name, f"'{name}' must be an object, not {_type_name(value)}")
    return value


def stop_strings(value: Any, name: str) -> tuple[str, ...]:
    """``stop``: a string or an array of non-empty strings (both APIs accept either)."""
    if value is None:
        return ()
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
        raise FieldError(name, f"'{name}' must be a string or an array of strings")
    if not all(items):
        raise FieldError(name, f"'{name}' must not hold an empty string")
    return tuple(items)


def refuse_if_set(body: dict[str, Any], key: str, why: str, *, param: str | None = None) -> None:
    """A feature the agent does not have: absent, null, false, empty or 0 pass; anything else
    is refused rather than silently ignored (the answer would not be what was asked)."""
    value = body.get(key)
    if value not in (None, False, "", [], {}, 0):
        name = param or key
        raise FieldError(name, f"'{name}' is not supported: {why}")


def roled_messages(
    value: list[Any], aliases: Mapping[str, str] = {}
) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(where, role, message) of each item of ``messages``; an item that is not an object or
    whose role is not one of ``ROLES`` (after ``aliases``) is a 400 naming it."""
    for index, item in enumerate(value):
        where = f"messages[{index}]"
        if not isinstance(item, dict):
            raise FieldError(where, f"'{where}' must be an object with 'role' and 'content'")
        role = string(item, "role", param=f"{where}.role")
        role = aliases.get(role, role)
        if role not in ROLES:
            known = ", ".join((*ROLES, *aliases))
            raise FieldError(f"{where}.role", f"'{where}.role' is {role!r}: the roles are {known}")
        yield where, role, item
