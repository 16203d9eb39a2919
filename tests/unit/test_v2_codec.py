"""The v2 codec on its own: round trips, and every malformed message refused by name."""

from __future__ import annotations

import json

import numpy as np
import pytest

from edgeagent.api import v2
from edgeagent.engine.errors import InvalidInput
from edgeagent.engine.requests import InferenceResponse, datatype_of, numpy_dtype
from edgeagent.models.package import TensorSpec


def _body(message: dict, tail: bytes = b"") -> tuple[bytes, str | None]:
    head = json.dumps(message).encode()
    return head + tail, (str(len(head)) if tail else None)


@pytest.mark.parametrize(
    "dtype", ["float32", "float64", "float16", "int8", "uint8", "int16", "int32", "int64", "bool"]
)
def test_binary_request_round_trip_every_dtype(dtype: str) -> None:
    array = (
        (np.arange(24).reshape(2, 3, 4) % 2 == 0)
        if dtype == "bool"
        else (np.arange(24, dtype=dtype).reshape(2, 3, 4))
    )
    body, header = v2.encode_request({"x": array}, binary=True)
    request = v2.decode_request(body, str(header))
    assert request.binary_output is True
    np.testing.assert_array_equal(request.inputs["x"], array)
    assert request.inputs["x"].dtype == array.dtype


def test_json_request_round_trip_and_nested_data() -> None:
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    body, header = v2.encode_request({"x": array}, binary=False, request_id="abc")
    assert header is None
    request = v2.decode_request(body, None)
    assert request.id == "abc"
    np.testing.assert_array_equal(request.inputs["x"], array)
    nested, _ = _body(
        {
            "inputs": [
                {"name": "x", "shape": [2, 3], "datatype": "FP32", "data": [[0, 1, 2], [3, 4, 5]]}
            ]
        }
    )
    np.testing.assert_array_equal(v2.decode_request(nested, None).inputs["x"], array)


def test_mixed_json_and_binary_inputs_keep_their_order() -> None:
    a = np.array([1.5, 2.5], dtype=np.float32)
    b = np.array([7, 8, 9], dtype=np.int64)
    body, header = _body(
        {
            "inputs": [
                {
                    "name": "a",
                    "shape": [2],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": 8},
                },
                {"name": "j", "shape": [1], "datatype": "INT32", "data": [3]},
                {
                    "name": "b",
                    "shape": [3],
                    "datatype": "INT64",
                    "parameters": {"binary_data_size": 24},
                },
            ],
            "parameters": {"sequence_id": 4, "custom": "tolerated"},
        },
        a.tobytes() + b.tobytes(),
    )
    request = v2.decode_request(body, header)
    np.testing.assert_array_equal(request.inputs["a"], a)
    np.testing.assert_array_equal(request.inputs["b"], b)
    assert request.inputs["j"].tolist() == [3]
    assert request.parameters["custom"] == "tolerated"


def test_zero_size_binary_tensor_is_legal() -> None:
    body, _ = _body(
        {
            "inputs": [
                {
                    "name": "x",
                    "shape": [0, 3],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": 0},
                }
            ]
        },
        b"",
    )
    request = v2.decode_request(body, str(len(body)))
    assert request.inputs["x"].shape == (0, 3)


BAD_MESSAGES = [
    (
        {"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1, 2, 3]}]},
        "3 elements",
    ),
    (
        {"inputs": [{"name": "x", "shape": [2], "datatype": "FP16", "data": [1, 2]}]},
        "FP16 cannot travel as JSON",
    ),
    ({"inputs": [{"name": "x", "shape": [2], "datatype": "BF16", "data": [1, 2]}]}, "BF16"),
    (
        {"inputs": [{"name": "x", "shape": [2], "datatype": "FP33", "data": [1, 2]}]},
        "unknown datatype 'FP33'",
    ),
    ({"inputs": [{"name": "x", "shape": [1], "datatype": "BYTES", "data": ["a"]}]}, "BYTES"),
    (
        {"inputs": [{"name": "x", "shape": [2], "datatype": "INT8", "data": [1, 300]}]},
        "out of range for INT8",
    ),
    (
        {"inputs": [{"name": "x", "shape": [2], "datatype": "INT32", "data": [1, 2.5]}]},
        "must hold INT32",
    ),
    (
        {"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": ["1", "2"]}]},
        "must hold FP32",
    ),
    (
        {"inputs": [{"name": "x", "shape": [2, 2], "datatype": "FP32", "data": [[1, 2], [3]]}]},
        "ragged",
    ),
    ({"inputs": [{"name": "x", "shape": [-1], "datatype": "FP32", "data": [1]}]}, "non-negative"),
    ({"inputs": [{"name": "x", "shape": [1], "datatype": "FP32"}]}, "exactly one of 'data'"),
    ({"inputs": [{"shape": [1], "datatype": "FP32", "data": [1]}]}, "'name'"),
    (
        {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}] * 2},
        "appears twice",
    ),
    ({"inputs": {"name": "x"}}, "must be a list"),
    ({"outputs": []}, "no 'inputs'"),
    ({"id": 5, "inputs": []}, "'id' must be a string"),
    ({"inputs": [], "parameters": {"binary_data_output": "yes"}}, "binary_data_output"),
    ({"inputs": [], "outputs": [{"name": "y", "parameters": {"binary_data": 1}}]}, "binary_data"),
]


@pytest.mark.parametrize(("message", "fragment"), BAD_MESSAGES)
def test_malformed_request_is_refused_by_name(message: dict, fragment: str) -> None:
    body, header = _body(message)
    with pytest.raises(InvalidInput) as caught:
        v2.decode_request(body, header)
    assert fragment in str(caught.value)


def test_not_json_and_not_an_object() -> None:
    for body in (b"{not json", b"[1, 2]", b"\xff\xfe"):
        with pytest.raises(InvalidInput, match="JSON"):
            v2.decode_request(body, None)


@pytest.mark.parametrize(
    ("shape", "tail", "fragment"),
    [
        ([2], 4, "runs past the end"),
        ([2], 12, "12 bytes of binary data but the inputs declare 8"),
        ([3], 8, "input 'x': binary_data_size is 8 bytes but shape"),
    ],
)
def test_binary_size_mismatches(shape: list[int], tail: int, fragment: str) -> None:
    tensor = {"name": "x", "shape": shape, "datatype": "FP32"}
    body, header = _body(
        {"inputs": [{**tensor, "parameters": {"binary_data_size": 8}}]}, b"\0" * tail
    )
    with pytest.raises(InvalidInput) as caught:
        v2.decode_request(body, header)
    assert fragment in str(caught.value)


@pytest.mark.parametrize(
    ("value", "fragment"), [("99", "only"), ("-1", "negative"), ("x", "integer")]
)
def test_header_length_is_checked(value: str, fragment: str) -> None:
    with pytest.raises(InvalidInput, match=fragment):
        v2.decode_request(b'{"inputs": []}', value)


def test_raw_body_is_the_single_input_with_batch_one() -> None:
    spec = TensorSpec("pixels", "float32", (-1, 3, 2, 2))
    data = np.arange(12, dtype=np.float32)
    request = v2.decode_raw_request(data.tobytes(), spec)
    assert request.inputs["pixels"].shape == (1, 3, 2, 2)
    assert request.binary_output is True
    with pytest.raises(InvalidInput, match="needs 48"):
        v2.decode_raw_request(data.tobytes()[:-4], spec)
    with pytest.raises(InvalidInput, match="variable dimensions"):
        v2.decode_raw_request(b"", TensorSpec("x", "float32", (-1, -1)))


def test_response_round_trip_with_per_output_binary_choice() -> None:
    probs = np.random.default_rng(0).random((2, 5)).astype(np.float32)
    top = np.array([[3], [1]], dtype=np.int64)
    body, header = v2.encode_response(
        InferenceResponse("m", "2", {"probs": probs, "top": top}, id="r1"),
        v2.WireRequest(inputs={}, placements={"probs": True}, binary_output=False),
    )
    assert header is not None
    head = json.loads(body[:header])
    assert head["outputs"][0]["parameters"] == {"binary_data_size": probs.nbytes}
    assert head["outputs"][1]["data"] == [3, 1]
    response = v2.decode_response(body, str(header))
    assert (response.model_name, response.model_version, response.id) == ("m", "2", "r1")
    np.testing.assert_array_equal(response.outputs["probs"], probs)
    np.testing.assert_array_equal(response.outputs["top"], top)


def test_fp16_output_as_json_is_refused() -> None:
    with pytest.raises(InvalidInput, match="binary_data = true"):
        v2.encode_response(
            InferenceResponse("m", "1", {"y": np.zeros(2, np.float16)}), v2.WireRequest(inputs={})
        )


def test_output_placements_follow_the_request_level_default() -> None:
    body = {
        "parameters": {"binary_data_output": True},
        "inputs": [],
        "outputs": [{"name": "b", "parameters": {"binary_data": False}}, {"name": "a"}],
    }
    request = v2.decode_request(json.dumps(body).encode(), None)
    assert request.outputs == ["b", "a"]
    assert [request.placement(name) for name in ("a", "b", "c")] == [True, False, True]


def test_datatype_table() -> None:
    assert datatype_of("float32") == "FP32"
    assert datatype_of(np.dtype(">f4")) == "FP32"
    assert datatype_of(np.bool_) == "BOOL"
    assert numpy_dtype("UINT16", "x") == np.dtype("uint16")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_json_floats_round_trip_exactly(dtype: str) -> None:
    rng = np.random.default_rng(5)
    values = (rng.standard_normal(500) * 10.0 ** rng.integers(-30, 30, 500)).astype(dtype)
    values[:4] = [0.0, -0.0, 1.0, np.finfo(dtype).max]
    body, header = v2.encode_request({"x": values}, binary=False)
    assert header is None
    decoded = v2.decode_request(body, None).inputs["x"]
    assert decoded.dtype == values.dtype
    np.testing.assert_array_equal(decoded, values)


def test_json_non_finite_values_and_a_lookalike_id() -> None:
    """NaN/inf fall back to json.dumps; an id that looks like a placeholder stays an id."""
    values = np.array([np.nan, np.inf, 1.5], dtype=np.float32)
    body, _ = v2.encode_response(
        InferenceResponse("m", "1", {"y": values}, id="@tensor-data:0:0"), v2.WireRequest({})
    )
    response = v2.decode_response(body, None)
    assert response.id == "@tensor-data:0:0"
    np.testing.assert_array_equal(response.outputs["y"], values)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (b'{"a": 18446744073709551615}', 2**64 - 1),  # the widest UINT64 (simdjson's range)
        (b'{"a": -9223372036854775808}', -(2**63)),
        (b'{"a": NaN}', None),  # not strict JSON: the lenient parser takes it
        ('{"a": "\u00e9"}'.encode(), "\u00e9"),
    ],
)
def test_json_objects_parse_the_same_on_the_fast_and_the_lenient_path(
    text: bytes, expected: object
) -> None:
    value = v2.parse_json_object(memoryview(text))["a"]
    assert value == expected or (expected is None and value != value)  # NaN != NaN


@pytest.mark.parametrize("value", ["18446744073709551616", "-9223372036854775809", "1" * 400])
def test_integers_beyond_64_bits_are_refused_whichever_parser_sees_them(value: str) -> None:
    for nan in ("", ', "n": NaN'):  # NaN sends the body down the lenient path
        tensor = f'{{"name": "x", "datatype": "FP32", "shape": [1], "data": [{value}]}}'
        body = f'{{"inputs": [{tensor}]{nan}}}'
        with pytest.raises(InvalidInput, match="64-bit range"):
            v2.decode_request(body.encode(), None)


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ("[[1.5], [2.5, 3.5]]", "ragged"),  # nested arrays take the general path
        ('[1.5, "2.5", 3.5]', "must hold FP32"),
        ("[1.5, 2.5]", "has 2 elements"),
    ],
)
def test_float_data_the_fast_path_cannot_take_is_judged_as_before(data: str, fragment: str) -> None:
    body = f'{{"inputs": [{{"name": "x", "datatype": "FP32", "shape": [3], "data": {data}}}]}}'
    with pytest.raises(InvalidInput, match=fragment):
        v2.decode_request(body.encode(), None)


def test_float_data_with_booleans_and_nesting_decodes_like_json() -> None:
    tensor = {"name": "x", "datatype": "FP64", "shape": [2, 2], "data": [[1, 2.5], [True, 4]]}
    body, header = _body({"inputs": [tensor]})
    decoded = v2.decode_request(body, header).inputs["x"]
    np.testing.assert_array_equal(decoded, [[1.0, 2.5], [1.0, 4.0]])


def test_keys_holding_a_nul_character_parse_like_json() -> None:
    """simdjson cannot look a NUL-holding key up by name (the fuzzer found a 500 there)."""
    text = b'{"a\\u0000b": 1, "inputs": [{"name": "x", "\\u0000": 2, "datatype": "FP32", "shape": [1], "data": [1.5]}]}'  # noqa: E501
    parsed = v2.parse_json_object(memoryview(text))
    assert parsed["a\x00b"] == 1
    assert parsed["inputs"][0]["\x00"] == 2
    assert np.asarray(parsed["inputs"][0]["data"]).tolist() == [1.5]


def test_a_float_tensors_flat_data_arrives_as_one_array() -> None:
    """The fast path's point: the numbers go from simdjson's buffer into numpy, never through
    a list of Python floats (reading values with ``items()`` once did that, at twice the CPU)."""
    text = b'{"id": "1", "inputs": [{"name": "x", "datatype": "FP32", "shape": [3], "data": [1.5, 2, -3]}]}'  # noqa: E501
    data = v2.parse_json_object(memoryview(text))["inputs"][0]["data"]
    assert isinstance(data, np.ndarray) and data.tolist() == [1.5, 2.0, -3.0]
