"""The Open Inference Protocol's (KServe v2) wire codec: JSON tensors and the binary extension.

Both sides of the wire speak it: the API's codec (``api/v2.py``) encodes what the CLI client
sends and decodes the answers it gets, and the remote runtime (``runtimes/remote.py``) encodes
the batches it sends a peer and decodes the peer's answers. It sits at the lowest layer both
may import, so a peer is sent exactly the bytes a client would send, and an answer is read by
one set of rules. A malformed message raises ``WireError`` (a ``ValueError``) naming the tensor
and what is wrong: the API turns it into a 400 (``InvalidInput``), the remote runtime into a
failed peer. Decoding a request, with its shared memory inputs and the engine's tensor checks,
stays with the API.
"""

from __future__ import annotations

import json
import math
import secrets
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgeagent.runtimes.oip import BY_DTYPE_NAME, DATATYPES, HEADER_LENGTH

# FP16 has no JSON form in the protocol (BF16 none at all), so both travel only as binary.
NOT_JSON = ("FP16", "BF16")


class WireError(ValueError):
    """A v2 message that cannot be read: names the tensor and what is wrong."""


def datatype_name(dtype: np.dtype) -> str:
    """The v2 datatype of a numpy dtype ('float32' -> 'FP32')."""
    name = BY_DTYPE_NAME.get(np.dtype(dtype).name)
    if name is None:
        raise WireError(
            f"numpy dtype {np.dtype(dtype).name} has no Open Inference Protocol datatype"
        )
    return name


def tensor_bytes(array: np.ndarray) -> bytes:
    """A tensor's bytes on the wire: C order, little-endian."""
    return np.ascontiguousarray(array, dtype=DATATYPES[datatype_name(array.dtype)]).tobytes()


class JsonData:
    """Tensor values as JSON array text, spliced into the message after ``json.dumps``.

    ``json.dumps`` of a Python float prints 17 digits through ``float.__repr__``, which makes
    a 224×224×3 FP32 input cost ~170 ms to encode here; printing each value with just the
    digits its own precision needs (9 for FP32, 17 for FP64) in one C-level ``%`` format is
    about 4× faster and still round-trips exactly. Non-finite values fall back to json.dumps.
    """

    def __init__(self) -> None:
        self._nonce = secrets.token_hex(8)
        self._texts: dict[str, str] = {}

    def add(self, array: np.ndarray) -> str:
        """A placeholder for ``array``'s values to put where the ``data`` list goes."""
        flat = array.ravel()
        if flat.dtype.kind == "f" and flat.size and bool(np.isfinite(flat).all()):
            digits = 9 if flat.dtype.itemsize <= 4 else 17
            text = "[" + ",".join([f"%.{digits}g"] * flat.size) % tuple(flat.tolist()) + "]"
        else:
            text = json.dumps(flat.tolist())
        token = f"@tensor-data:{self._nonce}:{len(self._texts)}"
        self._texts[json.dumps(token)] = text
        return token

    def frame(self, message: dict[str, Any], blobs: Sequence[bytes]) -> tuple[bytes, int | None]:
        """JSON header then the blobs; the header length is None when nothing binary follows."""
        head = json.dumps(message, separators=(",", ":"))
        for quoted, text in self._texts.items():
            head = head.replace(quoted, text, 1)
        encoded = head.encode()
        if not blobs:
            return encoded, None
        return b"".join([encoded, *blobs]), len(encoded)


def encode_request(
    inputs: Mapping[str, np.ndarray],
    *,
    binary: bool = True,
    outputs: Sequence[str] | None = None,
    request_id: str | None = None,
    parameters: Mapping[str, Any] | None = None,
) -> tuple[bytes, int | None]:
    """Build an infer request body; returns (body, header length or None when all JSON)."""
    entries: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    data = JsonData()
    for name, array in inputs.items():
        entry: dict[str, Any] = {
            "name": name,
            "shape": list(array.shape),
            "datatype": datatype_name(array.dtype),
        }
        if binary or entry["datatype"] in NOT_JSON:
            blob = tensor_bytes(array)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = data.add(array)
        entries.append(entry)
    params = dict(parameters or {})
    if binary:
        params["binary_data_output"] = True
    message: dict[str, Any] = {"inputs": entries}
    if params:
        message["parameters"] = params
    if request_id is not None:
        message["id"] = request_id
    if outputs is not None:
        message["outputs"] = [{"name": name} for name in outputs]
    return data.frame(message, blobs)


def header_length(value: str | None, body_length: int) -> int | None:
    """Parse ``Inference-Header-Content-Length``; None when absent (the whole body is JSON)."""
    if value is None:
        return None
    try:
        length = int(value.strip())
    except ValueError:
        raise WireError(f"{HEADER_LENGTH} must be an integer, got {value!r}") from None
    if length < 0:
        raise WireError(f"{HEADER_LENGTH} must not be negative, got {length}")
    if length > body_length:
        raise WireError(f"{HEADER_LENGTH} is {length} but the body has only {body_length} bytes")
    return length


def split_body(body: bytes, header: str | None) -> tuple[memoryview, memoryview]:
    """The JSON part and the binary tail of a body, given its header length value."""
    view = memoryview(body)
    length = header_length(header, len(body))
    if length is None:
        return view, view[len(view) :]
    return view[:length], view[length:]


@dataclass
class Response:
    """A decoded infer answer."""

    model_name: str
    model_version: str
    outputs: dict[str, np.ndarray]
    id: Any = None
    parameters: dict[str, Any] = field(default_factory=dict)


def _parse_json(data: memoryview) -> dict[str, Any]:
    try:
        value = json.loads(bytes(data))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise WireError(f"the answer is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise WireError("the answer must be a JSON object")
    return value


def decode_response(
    body: bytes,
    header: str | None,
    parse: Callable[[memoryview], dict[str, Any]] = _parse_json,
) -> Response:
    """Decode an infer answer, binary or JSON (``parse`` reads its JSON part into an object)."""
    json_part, tail = split_body(body, header)
    message = parse(json_part)
    return Response(
        model_name=str(message.get("model_name", "")),
        model_version=str(message.get("model_version", "")),
        outputs=_outputs(message.get("outputs"), tail),
        id=message.get("id"),
        parameters=parameters_of(message.get("parameters"), "response"),
    )


def parameters_of(value: Any, where: str) -> dict[str, Any]:
    """A message's or tensor's ``parameters``: a JSON object, or none."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise WireError(f"{where}: parameters must be a JSON object, got {value!r}")
    return value


def _binary_size(params: dict[str, Any], where: str) -> int | None:
    size = params.get("binary_data_size")
    if size is None:
        return None
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise WireError(f"{where}: binary_data_size must be a non-negative integer")
    return size


@dataclass
class Entry:
    """One tensor object of a message, its framing checked: exactly one of ``data`` (JSON
    values) and ``blob`` (its bytes of the binary tail), or neither when ``elsewhere``."""

    name: str
    where: str  # "input 'x'": how errors name it
    datatype: str
    shape: Any  # unchecked: the builder of the tensor checks it against the data
    parameters: dict[str, Any]
    data: Any = None
    blob: memoryview | None = None


def tensor_entries(
    entries: Any,
    tail: memoryview,
    kind: str,
    elsewhere: Callable[[dict[str, Any], str], bool] = lambda parameters, where: False,
) -> Iterator[Entry]:
    """The tensor objects of a list (request inputs, answer outputs), each with its share of
    the binary tail; the tail must be used up exactly. ``elsewhere(parameters, where)`` says a
    tensor carries neither data nor bytes (a shared memory region holds it)."""
    if not isinstance(entries, list):
        raise WireError(f"'{kind}s' must be a list of tensors")
    seen: set[str] = set()
    offset = 0
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise WireError(f"{kind}s[{index}] must be a JSON object")
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise WireError(f"{kind}s[{index}]: 'name' must be a non-empty string")
        where = f"{kind} {name!r}"
        if name in seen:
            raise WireError(f"{where} appears twice")
        seen.add(name)
        datatype = entry.get("datatype")
        if not isinstance(datatype, str):
            raise WireError(f"{where}: 'datatype' must be a string such as FP32")
        params = parameters_of(entry.get("parameters"), where)
        size = _binary_size(params, where)
        found = Entry(name, where, datatype, entry.get("shape"), params)
        if elsewhere(params, where):
            if "data" in entry or size is not None:
                raise WireError(
                    f"{where}: a shared memory {kind} carries no 'data' or binary_data_size"
                )
            yield found
            continue
        if ("data" in entry) == (size is not None):
            raise WireError(f"{where}: give exactly one of 'data' and parameters.binary_data_size")
        if size is None:
            found.data = entry["data"]
            yield found
            continue
        if offset + size > len(tail):
            raise WireError(
                f"{where}: binary_data_size {size} runs past the end of the body "
                f"({len(tail) - offset} bytes left)"
            )
        found.blob = tail[offset : offset + size]
        offset += size
        yield found
    if offset != len(tail):
        raise WireError(
            f"the body carries {len(tail)} bytes of binary data but the {kind}s declare {offset}"
        )


def _shape(value: Any, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**63 for d in value
    ):
        raise WireError(f"{where}: shape must be a list of non-negative integers, got {value!r}")
    return tuple(value)


def _outputs(entries: Any, tail: memoryview) -> dict[str, np.ndarray]:
    tensors: dict[str, np.ndarray] = {}
    for entry in tensor_entries(entries, tail, "output"):
        where, datatype = entry.where, entry.datatype
        dtype = DATATYPES.get(datatype)
        if dtype is None:
            raise WireError(f"{where}: datatype {datatype!r} is not a numeric v2 datatype")
        shape = _shape(entry.shape, where)
        count = math.prod(shape)
        if entry.blob is None:
            tensors[entry.name] = _from_values(entry.data, shape, count, dtype, datatype, where)
            continue
        if len(entry.blob) != count * dtype.itemsize:
            raise WireError(
                f"{where}: binary_data_size is {len(entry.blob)} bytes but shape {list(shape)} "
                f"of {datatype} needs {count * dtype.itemsize}"
            )
        array = np.frombuffer(entry.blob, dtype).astype(dtype.newbyteorder("="), copy=False)
        tensors[entry.name] = array.reshape(shape)
    return tensors


def _from_values(
    data: Any, shape: tuple[int, ...], count: int, dtype: np.dtype, datatype: str, where: str
) -> np.ndarray:
    if datatype in NOT_JSON:
        raise WireError(f"{where}: {datatype} cannot travel as JSON")
    if not isinstance(data, list | np.ndarray):
        data = [data]
    try:
        array = np.asarray(data, dtype=dtype.newbyteorder("="))
    except (TypeError, ValueError, OverflowError) as exc:
        raise WireError(f"{where}: data does not hold {datatype} values ({exc})") from None
    if array.size != count:
        raise WireError(
            f"{where}: data has {array.size} elements but shape {list(shape)} needs {count}"
        )
    return array.reshape(shape)
