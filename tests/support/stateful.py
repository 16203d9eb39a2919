"""A small streaming model with its state passed through the graph, and its own answers."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def leaky_onnx(path: Path) -> Path:
    """``state_out = 0.5 * state_in + x``, ``y = 2 * state_out``: a leaky sum, batched."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["state_in", "half"], ["kept"]),
            helper.make_node("Add", ["kept", "x"], ["state_out"]),
            helper.make_node("Mul", ["state_out", "two"], ["y"]),
        ],
        "leaky",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("state_in", TensorProto.FLOAT, ["batch", 4]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4]),
            helper.make_tensor_value_info("state_out", TensorProto.FLOAT, ["batch", 4]),
        ],
        [
            numpy_helper.from_array(np.array(0.5, np.float32), "half"),
            numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        ],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def leaky_reference(windows: np.ndarray) -> np.ndarray:
    """What both built models answer to a stream alone: 2 × the leaky sum so far."""
    total, answers = np.zeros(4, np.float32), []
    for window in windows:
        total = total * np.float32(0.5) + window
        answers.append(2 * total)
    return np.stack(answers)


def write_vad_heldout(path: Path, audio: np.ndarray) -> Path:
    """Silero VAD's validation feeds: each window with a zero state at 16 kHz."""
    np.savez(
        path,
        input=audio[:, None, :],
        state=np.zeros((len(audio), 2, 1, 128), np.float32),
        sr=np.full(len(audio), 16000, np.int64),
    )
    return path
