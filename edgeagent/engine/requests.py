"""Inference requests and responses as the engine takes and gives them, whatever the transport.

The HTTP codec (``api/v2.py``) and the gRPC servicer each decode their wire format into an
``InferenceRequest``, make one ``DataPlane.infer`` call and encode the ``InferenceResponse``;
how an output travels (binary, JSON, a shared memory region) stays with the transport.

Tensors are built here and only here, through one shape and datatype check: gRPC once built its
own and answered INTERNAL for shapes (``[0, 2**63 - 1]``, 1,000 dimensions) that HTTP refused
with a 400, because numpy's own refusal surfaced as an unexpected ``ValueError``. The datatype
names are the Open Inference Protocol's, which both transports speak.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgeagent.engine.errors import InvalidInput
from edgeagent.runtimes.oip import BY_DTYPE_NAME, DATATYPES

_UNSUPPORTED = {
    "BF16": "numpy has no bfloat16; send FP16 or FP32",
    "BYTES": "edgeagent models take numeric tensors only",
}
_BY_NAME = BY_DTYPE_NAME
# Every answer names its outputs' datatypes: a dict hit on the (native) dtype saves the
# ~2 µs numpy spends building ``dtype.name`` each time.
_BY_DTYPE = {np.dtype(name): v2 for name, v2 in _BY_NAME.items()}

# numpy refuses arrays beyond these even when a zero dimension leaves them empty (its size
# check multiplies every non-zero dimension); they bound what a tensor can be, not what a
# device can afford, which the body and message size limits already bound.
MAX_DIMS = 32
MAX_ELEMENTS = 2**40


def datatype_of(dtype: np.dtype | str) -> str:
    """The v2 datatype name for a numpy dtype or a package dtype name ('float32' -> 'FP32')."""
    if isinstance(dtype, np.dtype) and dtype in _BY_DTYPE:
        return _BY_DTYPE[dtype]
    name = np.dtype(dtype).name
    try:
        return _BY_NAME[name]
    except KeyError:
        raise InvalidInput(f"numpy dtype {name} has no Open Inference Protocol datatype") from None


def numpy_dtype(datatype: str, where: str) -> np.dtype:
    """The numpy dtype for a v2 datatype; InvalidInput names the tensor when it has none."""
    if datatype in _UNSUPPORTED:
        raise InvalidInput(
            f"{where}: datatype {datatype} is not supported: {_UNSUPPORTED[datatype]}"
        )
    try:
        return DATATYPES[datatype]
    except KeyError:
        known = ", ".join(DATATYPES)
        raise InvalidInput(f"{where}: unknown datatype {datatype!r} (known: {known})") from None


def check_shape(value: Any, where: str) -> tuple[int, ...]:
    """A tensor's shape from the wire (a JSON list, a protobuf's repeated int64 as a list),
    refused unless numpy can hold it.

    The rank is checked before anything is printed, so a million-dimension shape costs the
    client a short message, not a megabyte one.
    """
    if not isinstance(value, list | tuple):
        raise InvalidInput(f"{where}: shape must be a list of non-negative integers, got {value!r}")
    if len(value) > MAX_DIMS:
        raise InvalidInput(f"{where}: shape has {len(value)} dimensions, at most {MAX_DIMS}")
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in value):
        raise InvalidInput(
            f"{where}: shape must be a list of non-negative integers, got {list(value)!r}"
        )
    if math.prod(d for d in value if d) > MAX_ELEMENTS:
        raise InvalidInput(f"{where}: shape {list(value)!r} is larger than any tensor can be")
    return tuple(value)


def tensor_from_buffer(buffer: Any, shape: Any, datatype: str, where: str) -> np.ndarray:
    """A tensor from its little-endian bytes (binary data, gRPC raw contents, shared memory)."""
    dims = check_shape(shape, where)
    dtype = numpy_dtype(datatype, where)
    blob = memoryview(buffer)
    expected = math.prod(dims) * dtype.itemsize
    if blob.nbytes != expected:
        raise InvalidInput(
            f"{where}: binary_data_size is {blob.nbytes} bytes but shape {list(dims)} of "
            f"{datatype} needs {expected}"
        )
    return (
        np.frombuffer(blob, dtype=dtype).astype(dtype.newbyteorder("="), copy=False).reshape(dims)
    )


# What values may fill a tensor of each numpy kind: ints into floats are fine (JSON has no
# separate float literal for 1.0), floats into ints are not (they would be truncated silently).
_KINDS = {"f": "iuf", "i": "iu", "u": "iu", "b": "b"}


def tensor_from_values(values: Any, shape: Any, datatype: str, where: str) -> np.ndarray:
    """A tensor from a list of numbers (JSON ``data``, gRPC typed ``contents``), flat or nested.

    Values that do not fit the datatype are refused rather than wrapped or truncated.
    """
    dims = check_shape(shape, where)
    dtype = numpy_dtype(datatype, where)
    try:
        array = np.asarray(values)
    except ValueError:
        raise InvalidInput(f"{where}: data is a ragged nested list") from None
    count = math.prod(dims)
    if array.size != count:
        raise InvalidInput(
            f"{where}: data has {array.size} elements but shape {list(dims)} needs {count}"
        )
    if array.size and array.dtype.kind not in _KINDS[dtype.kind]:
        raise InvalidInput(f"{where}: data must hold {datatype} values, got {array.dtype.kind!r}")
    if dtype.kind in "iu" and array.size:
        info = np.iinfo(dtype)
        if array.min() < info.min or array.max() > info.max:
            raise InvalidInput(f"{where}: a value is out of range for {datatype}")
    return array.astype(dtype.newbyteorder("="), copy=False).reshape(dims)


@dataclass
class InferenceRequest:
    """What a client asks of a model: its tensors and the engine options it may set.

    ``parameters`` are the protocol's request parameters (the engine reads ``priority`` and
    ``timeout`` and tolerates the rest); ``deadline_s`` is a transport's own deadline (gRPC's),
    which can shorten the request's time, never lengthen it.
    """

    inputs: dict[str, np.ndarray]
    id: str | None = None
    parameters: Mapping[str, Any] = field(default_factory=dict)
    outputs: list[str] | None = None  # None: every output of the model, in its order
    deadline_s: float | None = None


@dataclass
class InferenceResponse:
    """A model's answer: the requested outputs, in the order asked for, in the datatypes the
    model's metadata advertises (whatever precision the variant computed in)."""

    model_name: str
    model_version: str
    outputs: dict[str, np.ndarray]
    id: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
