"""simdjson's strict parse of an infer message, each float tensor's flat ``data`` as doubles.

A 224×224×3 FP32 tensor sent as JSON is 150,528 numbers: json and orjson make a Python float of
each and numpy then reads them back (14 ms here); simdjson hands the array over as one buffer of
doubles (3 ms). What becomes of that buffer is the caller's: the daemon wraps it in a numpy
array, the JSON helper process (``helper_process``) copies it into shared memory. This
module imports no numpy, so the helper process stays small.

Anything simdjson refuses, or that this fast path does not take (a key holding NUL), raises
``ValueError`` or ``RuntimeError``; the caller then parses with json, whose rules and messages
are the contract.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import simdjson

# Tensors whose flat ``data`` array is handed over as one buffer of doubles.
FLOAT_DATATYPES = frozenset({"FP16", "FP32", "FP64"})

# What the caller makes of a float tensor's buffer of doubles (an ``ArrayBuffer``).
TakeDoubles = Callable[[Any], Any]


def parse_message(data: bytes | memoryview, take_doubles: TakeDoubles) -> Any:
    """The message as Python objects, each float tensor's flat ``data`` as ``take_doubles(buf)``.

    Only the tensor lists (``inputs``, ``outputs``) are walked; every other value is built as
    plain Python objects.
    """
    document = simdjson.Parser().parse(data)
    if not isinstance(document, simdjson.Object):
        return _plain(document)
    return {
        key: _tensor_list(document[key], take_doubles)
        if key in ("inputs", "outputs")
        else _plain(document[key])
        for key in _keys(document)
    }


def _keys(value: Any) -> list[str]:
    """An object's keys; ValueError (so the lenient parser takes the body) for a key holding
    NUL, which simdjson cannot look up. items() would work but builds every value as Python
    objects, a tensor's ``data`` too, which is what the fast path exists to avoid."""
    keys = list(value.keys())
    if any("\0" in key for key in keys):
        raise ValueError("a JSON key holds NUL")
    return keys


def _plain(value: Any) -> Any:
    """A simdjson value as Python objects (lists, dicts, str, numbers)."""
    if isinstance(value, simdjson.Object):
        return value.as_dict()
    if isinstance(value, simdjson.Array):
        return value.as_list()
    return value


def _tensor_list(value: Any, take_doubles: TakeDoubles) -> Any:
    if not isinstance(value, simdjson.Array):
        return _plain(value)
    return [
        _tensor_object(entry, take_doubles) if isinstance(entry, simdjson.Object) else _plain(entry)
        for entry in value
    ]


def _tensor_object(entry: Any, take_doubles: TakeDoubles) -> dict[str, Any]:
    datatype = entry.get("datatype")
    return {
        key: _numbers(entry[key], datatype, take_doubles) if key == "data" else _plain(entry[key])
        for key in _keys(entry)
    }


def _numbers(value: Any, datatype: Any, take_doubles: TakeDoubles) -> Any:
    """A float tensor's flat array of numbers through ``take_doubles``; anything else (nested,
    mixed, other datatypes) as Python objects for the decoder to judge."""
    if (
        datatype in FLOAT_DATATYPES
        and isinstance(value, simdjson.Array)
        and not (len(value) and isinstance(value[0], simdjson.Array | simdjson.Object))
    ):
        try:
            buffer = value.as_buffer(of_type="d")
        except TypeError:  # not only numbers (booleans, strings)
            pass
        else:
            return take_doubles(buffer)
    return _plain(value)
