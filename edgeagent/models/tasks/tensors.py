"""Detection, segmentation and plain tensor models: the golden record is the output tensors.

There is no class to compare, so every output must stay within ``atol + rtol·|expected|`` of
the reference. The packager records the tolerance from what its own variants measured (int8
is further from fp32 than fp16), so the check is as tight as the package's variants allow.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


def key(index: int) -> str:
    """The golden-file key of output ``index`` (output names may hold '/' or ':')."""
    return f"expected_{index}"


def record(outputs: Sequence[np.ndarray], atol: float, rtol: float) -> dict[str, np.ndarray]:
    arrays = {key(i): np.asarray(value, dtype=np.float32) for i, value in enumerate(outputs)}
    return {**arrays, "atol": np.float64(atol), "rtol": np.float64(rtol)}


def problem(
    golden: Mapping[str, np.ndarray], outputs: Sequence[np.ndarray], names: Sequence[str]
) -> str:
    if "atol" not in golden or "rtol" not in golden:
        return "the golden file lacks atol/rtol (the recorded tolerance)"
    atol, rtol = float(golden["atol"]), float(golden["rtol"])
    for index, (name, value) in enumerate(zip(names, outputs, strict=True)):
        if key(index) not in golden:
            return f"the golden file lacks {key(index)} (the expected {name!r})"
        expected = np.asarray(golden[key(index)], dtype=np.float32)
        actual = np.asarray(value, dtype=np.float32)
        if actual.shape != expected.shape:
            return f"output {name!r} has shape {actual.shape}, the golden one {expected.shape}"
        if not np.all(np.isfinite(actual)):
            return f"output {name!r} holds NaN or infinity"
        excess = np.abs(actual - expected) - (atol + rtol * np.abs(expected))
        if np.any(excess > 0):
            worst = float(np.max(np.abs(actual - expected)))
            return (
                f"output {name!r} is {worst:.3g} from the golden answer "
                f"(tolerance {atol:g} + {rtol:g}·|expected|)"
            )
    return ""
