"""Open Inference Protocol (KServe v2) codec: JSON tensors and the binary tensor data extension.

Pure functions from bytes to the engine's request and response types (``engine/requests.py``)
and back, with no HTTP in them, so the server (http/v2_routes.py) and the CLI client (client.py)
share one implementation and one set of rules. Every malformed message raises ``InvalidInput``
naming the tensor and what is wrong, because a 400 that says "bad request" is useless to the
author of a client on the other side of a fleet. Tensors are built by the engine's one checked
builder, which the gRPC servicer uses too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgeagent.api.jsonparse import simd
from edgeagent.api.shm.regions import CallerRegions, SharedMemoryRef, shm_ref
from edgeagent.engine.errors import InvalidInput
from edgeagent.engine.requests import (
    DATATYPES,
    InferenceRequest,
    InferenceResponse,
    datatype_of,
    tensor_from_buffer,
    tensor_from_values,
)
from edgeagent.models.package import TensorSpec
from edgeagent.runtimes import oip_codec
from edgeagent.runtimes.oip import HEADER_LENGTH as HEADER_LENGTH
from edgeagent.runtimes.oip_codec import NOT_JSON, JsonData, WireError
from edgeagent.runtimes.oip_codec import tensor_bytes as tensor_to_bytes

# How an output travels: binary (True), JSON (False) or into a shared memory region.
Placement = bool | SharedMemoryRef


@dataclass
class WireRequest(InferenceRequest):
    """An infer request as the engine takes it, plus how the client wants each output sent.

    The placements are the transport's business: the data plane sees an ``InferenceRequest``
    and answers arrays; the encoder asks ``placement`` how each one travels back.
    """

    placements: dict[str, Placement] = field(default_factory=dict)  # outputs named in the request
    binary_output: bool = False  # request-level parameters.binary_data_output

    def placement(self, name: str) -> Placement:
        return self.placements.get(name, self.binary_output)


# The client's name for the answer it decodes.
InferResponse = InferenceResponse


# ---------------------------------------------------------------------------------------------
# Message framing: JSON header + binary tail


# No number in the protocol is wider than 64 bits (shapes, sizes, UINT64/INT64 data, µs).
INT_MIN, INT_MAX = -(2**63), 2**64 - 1
MAX_INT_DIGITS = 20


def _bounded_int(text: str) -> int:
    """json's ``parse_int``: refuse integers no tensor or parameter can hold, before ``int()``
    spends time on thousands of digits (or Python refuses them with an unexpected error)."""
    if len(text.lstrip("-")) > MAX_INT_DIGITS or not INT_MIN <= (value := int(text)) <= INT_MAX:
        shown = text if len(text) <= 24 else text[:24] + "…"
        raise InvalidInput(f"JSON integer {shown} is out of the 64-bit range")
    return value


def parse_json_object(data: bytes | memoryview) -> dict[str, Any]:
    """A JSON object from untrusted bytes; every way it can be wrong is ``InvalidInput``.

    Nesting deeper than the interpreter's recursion limit and integers beyond 64 bits are
    refused here with the rest of malformed JSON (``NaN`` stays: tensors may carry it).
    simdjson reads strict JSON; whatever it refuses goes to json, whose rules and messages
    are the contract.
    """
    try:
        value = _parse_json_fast(data)
    except (ValueError, RuntimeError):  # simdjson's errors (UnicodeDecodeError included)
        value = _parse_json_leniently(data)
    if not isinstance(value, dict):
        raise InvalidInput("request body must be a JSON object")
    return value


def _parse_json_fast(data: bytes | memoryview) -> Any:
    """simdjson, with each float tensor's flat ``data`` as a float64 array, not a list."""
    return simd.parse_message(data, doubles_array)


def doubles_array(buffer: Any) -> np.ndarray:
    """A buffer of doubles (simdjson's, or the JSON helper's shared memory) as float64."""
    return np.frombuffer(buffer, dtype=np.float64)


def _parse_json_leniently(data: bytes | memoryview) -> Any:
    """The stdlib parser: NaN and Infinity accepted, integers beyond 64 bits refused."""
    try:
        return json.loads(bytes(data), parse_int=_bounded_int)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidInput(f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise InvalidInput("request body is not valid JSON: nested too deeply") from None


def split_body(body: bytes, header: str | None) -> tuple[memoryview, memoryview]:
    """The JSON part and the binary tail of a body, given its ``Inference-Header-Content-Length``
    header value."""
    try:
        return oip_codec.split_body(body, header)
    except WireError as exc:
        raise InvalidInput(str(exc)) from None


# ---------------------------------------------------------------------------------------------
# Tensors


def _parameters(value: Any, where: str) -> dict[str, Any]:
    try:
        return oip_codec.parameters_of(value, where)
    except WireError as exc:
        raise InvalidInput(str(exc)) from None


def _from_json(data: Any, shape: Any, datatype: str, where: str) -> np.ndarray:
    if datatype in NOT_JSON:
        raise InvalidInput(
            f"{where}: {datatype} cannot travel as JSON; send it with the binary tensor data "
            f"extension (parameters.binary_data_size)"
        )
    if not isinstance(data, list | np.ndarray):  # an array: a float tensor's parsed data
        data = [data]
    return tensor_from_values(data, shape, datatype, where)


def _tensors(
    entries: Any, tail: memoryview, kind: str, regions: CallerRegions | None = None
) -> dict[str, np.ndarray]:
    """Decode a list of tensor objects (request inputs), each built by the engine's checked
    builders; the framing (names, data or bytes, the binary tail) is ``oip_codec``'s.

    An input that names a shared memory region is a copy read from that region; with no
    ``regions`` (a client), naming one is an error.
    """
    tensors: dict[str, np.ndarray] = {}
    try:
        for entry in oip_codec.tensor_entries(entries, tail, kind, _in_region):
            where, shape, datatype = entry.where, entry.shape, entry.datatype
            ref = shm_ref(entry.parameters, where)
            if ref is not None:
                tensors[entry.name] = tensor_from_region(ref, shape, datatype, regions, where)
            elif entry.blob is None:
                tensors[entry.name] = _from_json(entry.data, shape, datatype, where)
            else:
                tensors[entry.name] = tensor_from_buffer(entry.blob, shape, datatype, where)
    except WireError as exc:
        raise InvalidInput(str(exc)) from None
    return tensors


def _in_region(parameters: dict[str, Any], where: str) -> bool:
    return shm_ref(parameters, where) is not None


def _output_requests(value: Any) -> tuple[list[str] | None, dict[str, Placement]]:
    """The outputs a request names (None: all) and how each named one travels, checked here
    so that a bad flag costs the client a 400 before the model runs."""
    if value is None:
        return None, {}
    if not isinstance(value, list):
        raise InvalidInput("'outputs' must be a list of {\"name\": ...} objects")
    names: list[str] = []
    placements: dict[str, Placement] = {}
    for index, entry in enumerate(value):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise InvalidInput(f"outputs[{index}] must be an object with a string 'name'")
        name = entry["name"]
        where = f"output {name!r}"
        parameters = _parameters(entry.get("parameters"), where)
        binary = parameters.get("binary_data")
        if binary is not None and not isinstance(binary, bool):
            raise InvalidInput(f"{where}: binary_data must be true or false")
        names.append(name)
        ref = shm_ref(parameters, where)
        if ref is not None:
            placements[name] = ref
        elif binary is not None:
            placements[name] = binary
    return names, placements


# ---------------------------------------------------------------------------------------------
# Requests (server decodes, client encodes)


def decode_request(
    body: bytes, header: str | None, regions: CallerRegions | None = None
) -> WireRequest:
    """Decode an infer request body given its ``Inference-Header-Content-Length`` header value;
    inputs may name ``regions`` (the shared memory extension)."""
    json_part, tail = split_body(body, header)
    return decode_message(parse_json_object(json_part), tail, regions)


def decode_message(
    message: dict[str, Any], tail: memoryview, regions: CallerRegions | None = None
) -> WireRequest:
    """An infer request from its parsed JSON part and binary tail (see ``decode_request``)."""
    parameters = _parameters(message.get("parameters"), "request")
    request_id = message.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidInput(f"'id' must be a string, got {request_id!r}")
    if "inputs" not in message:
        raise InvalidInput("request has no 'inputs'")
    binary_output = parameters.get("binary_data_output", False)
    if not isinstance(binary_output, bool):
        raise InvalidInput("parameters.binary_data_output must be true or false")
    outputs, placements = _output_requests(message.get("outputs"))
    return WireRequest(
        inputs=_tensors(message["inputs"], tail, "input", regions),
        id=request_id,
        parameters=parameters,
        outputs=outputs,
        placements=placements,
        binary_output=binary_output,
    )


def decode_raw_request(body: bytes, spec: TensorSpec) -> WireRequest:
    """Triton's ``Inference-Header-Content-Length: 0``: the body is one input's raw bytes, batch 1.

    Only a model with a single input whose shape is fixed apart from the batch can be fed this
    way, since nothing else in the request says what the bytes are.
    """
    shape = tuple(1 if index == 0 and dim == -1 else dim for index, dim in enumerate(spec.shape))
    if any(dim < 0 for dim in shape):
        raise InvalidInput(
            f"input {spec.name!r} has variable dimensions {list(spec.shape)}; a raw body "
            f"({HEADER_LENGTH}: 0) needs a fixed shape, send a JSON header instead"
        )
    datatype = datatype_of(spec.dtype)
    array = tensor_from_buffer(body, shape, datatype, f"input {spec.name!r}")
    return WireRequest(inputs={spec.name: array}, binary_output=True)


def encode_request(inputs: Mapping[str, np.ndarray], **options: Any) -> tuple[bytes, int | None]:
    """Build an infer request body (``oip_codec.encode_request``: binary, outputs, request_id,
    parameters); returns (body, header length or None when all JSON)."""
    try:
        return oip_codec.encode_request(inputs, **options)
    except WireError as exc:
        raise InvalidInput(str(exc)) from None


# ---------------------------------------------------------------------------------------------
# Responses (server encodes, client decodes)


def encode_response(
    response: InferenceResponse,
    request: WireRequest,
    regions: CallerRegions | None = None,
) -> tuple[bytes, int | None]:
    """Build the body of the data plane's ``response`` to ``request``, each output placed as the
    request asked; one placed in shared memory is written into its region here."""
    entries: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    data = JsonData()
    for name, array in response.outputs.items():
        datatype = datatype_of(array.dtype)
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        placement = request.placement(name)
        if isinstance(placement, SharedMemoryRef):
            entry["parameters"] = write_to_region(array, placement, regions, f"output {name!r}")
        elif placement:
            blob = tensor_to_bytes(array)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        elif datatype in NOT_JSON:
            raise InvalidInput(
                f"output {name!r} is {datatype}, which cannot travel as JSON; request it with "
                f"parameters.binary_data = true"
            )
        else:
            entry["data"] = data.add(array)
        entries.append(entry)
    message: dict[str, Any] = {
        "model_name": response.model_name,
        "model_version": response.model_version,
        "outputs": entries,
    }
    if response.id is not None:
        message["id"] = response.id
    return data.frame(message, blobs)


def tensor_from_region(
    ref: SharedMemoryRef,
    shape: Any,
    datatype: str,
    regions: CallerRegions | None,
    where: str,
) -> np.ndarray:
    """An input read from the region ``ref`` names (both transports read shared memory here)."""
    if regions is None:
        raise InvalidInput(f"{where}: shared memory is not available on this path")
    blob = regions.read(ref.region, ref.offset, ref.byte_size, where)
    return tensor_from_buffer(blob, shape, datatype, where)


def write_to_region(
    array: np.ndarray, ref: SharedMemoryRef, regions: CallerRegions | None, where: str
) -> dict[str, Any]:
    """Copy ``array`` (wire dtype) into the region ``ref`` names; the output's parameters."""
    if regions is None:
        raise InvalidInput(f"{where}: shared memory is not available on this path")
    wire = DATATYPES[datatype_of(array.dtype)]
    size = array.size * wire.itemsize
    if size > ref.byte_size:
        raise InvalidInput(
            f"{where}: needs {size} bytes but shared_memory_byte_size is {ref.byte_size}"
        )
    wired = np.ascontiguousarray(array).astype(wire, casting="same_kind", copy=False)
    regions.write(ref.region, ref.offset, wired.reshape(-1).view(np.uint8).data, where)
    return SharedMemoryRef(ref.region, ref.offset, size).parameters()


def decode_response(body: bytes, header: str | None) -> InferenceResponse:
    """Decode an infer response body (the client side of ``encode_response``)."""
    try:
        answer = oip_codec.decode_response(body, header, parse_json_object)
    except WireError as exc:
        raise InvalidInput(str(exc)) from None
    return InferenceResponse(
        model_name=answer.model_name,
        model_version=answer.model_version,
        outputs=answer.outputs,
        id=answer.id,
        parameters=answer.parameters,
    )
