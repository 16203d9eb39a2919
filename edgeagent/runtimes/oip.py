"""The Open Inference Protocol's tensor datatypes, for both sides of the wire.

The engine's request codec (``engine.requests``) decodes what clients send with this table and
the wire codec (``runtimes.oip_codec``, which the API and the remote runtime share) encodes and
decodes with it: one table, at the lowest layer all of them may import.
"""

from __future__ import annotations

import numpy as np

# v2 datatype -> numpy dtype (little-endian on the wire). BF16 has no numpy type and BYTES no
# model that could take it (package dtypes are numeric), so both are refused by name.
DATATYPES = {
    "BOOL": np.dtype("bool"),
    "UINT8": np.dtype("<u1"),
    "UINT16": np.dtype("<u2"),
    "UINT32": np.dtype("<u4"),
    "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"),
    "INT16": np.dtype("<i2"),
    "INT32": np.dtype("<i4"),
    "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"),
    "FP32": np.dtype("<f4"),
    "FP64": np.dtype("<f8"),
}
# The v2 name of each numpy dtype name ("float32" -> "FP32").
BY_DTYPE_NAME = {dtype.name: v2 for v2, dtype in DATATYPES.items()}
# The header that says where a binary-extension body's JSON ends.
HEADER_LENGTH = "Inference-Header-Content-Length"
