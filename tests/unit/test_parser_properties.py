"""Property tests of two parsers that see untrusted bytes (issue 10, "keep it attacked"): the
v2 codec (every request body a client sends) and model.toml (every package an update brings).

Each either answers or refuses with its own error type (``InvalidInput``, ``PackageError``);
anything else escaping would be a 500 or a crashed install. And what the codec encodes, it
decodes back unchanged.
"""

from __future__ import annotations

import contextlib
import json
import re
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from edgeagent.api import v2
from edgeagent.engine.errors import InvalidInput
from edgeagent.engine.requests import DATATYPES
from edgeagent.models.package import PackageError, load_package
from tests.support.helpers import write_tiny_package

DTYPES = ["float32", "float64", "float16", "int8", "uint8", "int16", "int32", "int64", "bool"]
FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

arrays = st.sampled_from(DTYPES).flatmap(
    lambda dtype: hnp.arrays(np.dtype(dtype), hnp.array_shapes(min_dims=0, max_dims=4, max_side=5))
)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=20,
)


# Zero (an empty tensor, whose other dimensions numpy still multiplies) next to huge ones.
DIMENSIONS = st.sampled_from([0, 1, 3, 8, 2**31, 2**62, 2**64, 10**30]) | st.integers(-2, 2**64)


def _tensor_entries() -> st.SearchStrategy[dict]:
    """Tensor objects that are plausible in places and wrong in others."""
    return st.fixed_dictionaries(
        {},
        optional={
            "name": st.sampled_from(["input", "", "x"]) | json_values,
            "datatype": st.sampled_from([*DATATYPES, "BF16", "BYTES", "fp32"]) | json_values,
            "shape": st.lists(DIMENSIONS, max_size=6) | json_values,
            "data": st.just([]) | json_values,
            "parameters": st.fixed_dictionaries(
                {}, optional={"binary_data_size": st.integers(-1, 64) | json_values}
            )
            | json_values,
        },
    )


@FAST
@given(arrays, st.booleans())
def test_what_is_encoded_decodes_back_unchanged(array: np.ndarray, binary: bool) -> None:
    body, header = v2.encode_request({"x": array}, binary=binary)
    decoded = v2.decode_request(body, None if header is None else str(header)).inputs["x"]
    assert decoded.dtype == array.dtype and decoded.shape == array.shape
    np.testing.assert_array_equal(decoded, array)


@FAST
@given(st.binary(max_size=512), st.none() | st.text(max_size=6))
def test_any_bytes_are_decoded_or_refused_as_invalid_input(body: bytes, header: str | None):
    with contextlib.suppress(InvalidInput):
        v2.decode_request(body, header)


@FAST
@given(
    st.fixed_dictionaries(
        {},
        optional={
            "inputs": st.lists(_tensor_entries(), max_size=3) | json_values,
            "outputs": json_values,
            "parameters": json_values,
            "id": json_values,
        },
    ),
    st.binary(max_size=64),
)
def test_any_message_is_decoded_or_refused_as_invalid_input(message: dict, tail: bytes) -> None:
    head = json.dumps(message).encode()
    with contextlib.suppress(InvalidInput):
        v2.decode_request(head + tail, str(len(head)) if tail else None)


@FAST
@given(st.lists(DIMENSIONS, max_size=40), st.sampled_from(list(DATATYPES)), st.booleans())
def test_any_shape_is_decoded_or_refused(shape: list[int], datatype: str, binary: bool) -> None:
    """Well-formed tensors but for their shape: empty data, or an empty binary blob."""
    tensor: dict = {"name": "x", "datatype": datatype, "shape": shape}
    if binary:
        tensor["parameters"] = {"binary_data_size": 0}
    else:
        tensor["data"] = []
    head = json.dumps({"inputs": [tensor]}).encode()
    with contextlib.suppress(InvalidInput):
        v2.decode_request(head, str(len(head)))


@FAST
@given(st.integers(1, 20_000), st.sampled_from(["[", '{"a":', '[{"b":']))
def test_nesting_of_any_depth_is_decoded_or_refused(depth: int, opener: str) -> None:
    closer = {"[": "]", '{"a":': "}", '[{"b":': "}]"}[opener]
    body = ('{"inputs":' + opener * depth + "1" + closer * depth + "}").encode()
    with contextlib.suppress(InvalidInput):
        v2.decode_request(body, None)


@FAST
@given(st.binary(max_size=512), st.none() | st.text(max_size=6))
def test_any_response_bytes_are_decoded_or_refused(body: bytes, header: str | None) -> None:
    with contextlib.suppress(InvalidInput):
        v2.decode_response(body, header)


# -- model.toml -----------------------------------------------------------------------------

TOML_VALUES = st.sampled_from(
    [
        "-1", "0", "1e400", "nan", "inf", "99999999999999999999999999", '"x\\n"', '"../../etc"',
        '"/etc/passwd"', '""', "[]", "[[]]", "{}", "true", '"ä"', "[1, 2, 3]", '["a", 1]',
        '{ a = 1 }', '"int4"', '"NHWC"', "1979-05-27", '"' + "9" * 300 + '"',
    ]
)  # fmt: skip
ASSIGNMENT = re.compile(r"^(\s*[A-Za-z_][\w.]*\s*=\s*)(.+)$", re.MULTILINE)


@pytest.fixture(scope="module")
def manifest() -> str:
    with tempfile.TemporaryDirectory() as root:
        return (write_tiny_package(Path(root) / "tiny") / "model.toml").read_text()


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_any_edited_model_toml_loads_or_is_refused_as_a_package_error(
    manifest: str, data: st.DataObject
) -> None:
    """Values of the valid manifest replaced with hostile ones, lines dropped or garbled."""
    lines = manifest.splitlines()
    for _ in range(data.draw(st.integers(1, 4))):
        index = data.draw(st.integers(0, len(lines) - 1))
        edit = data.draw(st.sampled_from(["value", "drop", "garble"]))
        match = ASSIGNMENT.match(lines[index])
        if edit == "value" and match:
            lines[index] = match.group(1) + data.draw(TOML_VALUES)
        elif edit == "drop":
            lines[index] = ""
        else:
            lines[index] = data.draw(st.text(max_size=20))
    with tempfile.TemporaryDirectory() as root:
        package = write_tiny_package(Path(root) / "tiny")
        (package / "model.toml").write_text("\n".join(lines), encoding="utf-8", errors="replace")
        with contextlib.suppress(PackageError):
            load_package(package)
