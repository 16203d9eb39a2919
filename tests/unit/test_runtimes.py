"""The runtime plugins on a tiny real ONNX model: results, names, honest errors, precision."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgeagent.runtimes import (
    InferenceError,
    LoadRequest,
    RuntimeLoadError,
    RuntimeUnavailable,
    get_runtime,
    runtime_status,
)
from tests.support.helpers import write_tiny_onnx


@pytest.fixture
def tiny_onnx(tmp_path: Path) -> tuple[Path, np.ndarray]:
    path = tmp_path / "tiny.onnx"
    return path, write_tiny_onnx(path, classes=5, size=8)


def _expected(batch: np.ndarray, weights: np.ndarray) -> np.ndarray:
    return batch.mean(axis=(2, 3)) @ weights


@pytest.mark.parametrize("runtime", ["onnxruntime", "openvino"])
def test_onnx_model_runs_with_logical_names(runtime: str, tiny_onnx) -> None:
    path, weights = tiny_onnx
    session = get_runtime(runtime).load(
        LoadRequest(files=(path,), threads=1, input_names=("image",), output_names=("scores",))
    )
    try:
        assert [t.name for t in session.inputs] == ["image"]
        assert session.inputs[0].shape == (-1, 3, 8, 8)
        batch = np.random.default_rng(1).standard_normal((3, 3, 8, 8)).astype(np.float32)
        out = session.run({"image": batch})
        assert list(out) == ["scores"]
        np.testing.assert_allclose(out["scores"], _expected(batch, weights), rtol=1e-5, atol=1e-5)
        # a single unnamed feed binds by position
        one = session.run({"x": batch[:1]})["scores"]
        np.testing.assert_allclose(one, out["scores"][:1], 1e-5)
    finally:
        session.close()


@pytest.mark.parametrize(
    ("options", "spinning", "duration"),
    [
        ({}, "1", "100"),
        ({"spin_duration_us": 500}, "1", "500"),
        ({"allow_spinning": False}, "0", ""),
    ],
)
def test_onnxruntime_threads_spin_briefly_unless_the_candidate_says_otherwise(
    tiny_onnx, options: dict, spinning: str, duration: str
) -> None:
    """Intra-op threads spin 100 µs before sleeping, or as the profile's candidate says (these
    are session options, not provider options); the session runs either way."""
    path, _ = tiny_onnx
    session = get_runtime("onnxruntime").load(LoadRequest(files=(path,), options=options))
    try:
        chosen = session._session.get_session_options()  # type: ignore[attr-defined]
        assert chosen.get_session_config_entry("session.intra_op.allow_spinning") == spinning
        if duration:
            entry = chosen.get_session_config_entry("session.intra_op.spin_duration_us")
            assert entry == duration
        assert session.run({"x": np.ones((2, 3, 8, 8), np.float32)})["logits"].shape == (2, 5)
    finally:
        session.close()
    with pytest.raises(RuntimeLoadError, match="spin_duration_us must be a whole number"):
        get_runtime("onnxruntime").load(
            LoadRequest(files=(path,), options={"spin_duration_us": "fast"})
        )


def test_nhwc_variant_receives_channels_last(tmp_path: Path) -> None:
    """A variant declared NHWC gets the client's NCHW batch transposed."""
    path = tmp_path / "t.onnx"
    weights = write_tiny_onnx(path, classes=2, size=8)
    session = get_runtime("onnxruntime").load(LoadRequest(files=(path,), layout="NHWC"))
    batch = np.random.default_rng(2).standard_normal((1, 8, 3, 8)).astype(np.float32)
    # The file wants (N,3,8,8); feeding (N,8,3,8) declared NCHW becomes (N,3,8,8) after the
    # transpose, so the result equals the file run on the transposed array.
    expected = _expected(batch.transpose(0, 2, 3, 1), weights)
    np.testing.assert_allclose(session.run({"input": batch})["logits"], expected, rtol=1e-5)


def test_missing_accelerators_report_the_runtime_error(tiny_onnx) -> None:
    path, _ = tiny_onnx
    with pytest.raises(RuntimeLoadError, match="no CUDAExecutionProvider in this build"):
        get_runtime("onnxruntime").load(LoadRequest(files=(path,), device="CUDAExecutionProvider"))
    with pytest.raises(RuntimeLoadError, match="could not compile tiny.onnx for NPU"):
        get_runtime("openvino").load(LoadRequest(files=(path,), device="NPU"))
    with pytest.raises(RuntimeLoadError, match="could not load delegate libedgetpu.so.1"):
        get_runtime("litert").load(
            LoadRequest(files=(path.with_suffix(".tflite"),), device="EDGETPU")
        )


def test_corrupt_model_is_a_load_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage" * 10)
    with pytest.raises(RuntimeLoadError, match="could not load bad.onnx"):
        get_runtime("onnxruntime").load(LoadRequest(files=(bad,)))
    with pytest.raises(RuntimeLoadError, match="could not compile bad.onnx"):
        get_runtime("openvino").load(LoadRequest(files=(bad,)))


def test_wrong_shape_is_an_inference_error(tiny_onnx) -> None:
    path, _ = tiny_onnx
    session = get_runtime("onnxruntime").load(LoadRequest(files=(path,)))
    with pytest.raises(InferenceError, match="onnxruntime"):
        session.run({"input": np.zeros((1, 4, 8, 8), np.float32)})
    with pytest.raises(InferenceError, match="expected inputs input"):
        session.run({"a": np.zeros(1), "b": np.zeros(1)})


def test_openvino_fp32_variant_really_runs_in_f32(tmp_path: Path) -> None:
    """On CPUs with bf16 support OpenVINO would silently compute in bf16; fp32 must stay f32."""
    path = tmp_path / "tiny.onnx"
    weights = write_tiny_onnx(path, classes=5, size=8, seed=3)
    batch = np.random.default_rng(4).standard_normal((4, 3, 8, 8)).astype(np.float32) * 100
    exact = _expected(batch, weights)
    openvino = get_runtime("openvino")
    session = openvino.load(LoadRequest(files=(path,), precision="fp32"))
    assert session.inference_precision == "f32"
    np.testing.assert_allclose(session.run({"input": batch})["logits"], exact, rtol=1e-5, atol=1e-4)


def test_unknown_runtime_and_status() -> None:
    with pytest.raises(RuntimeUnavailable, match="unknown runtime 'tensorflow'"):
        get_runtime("tensorflow")
    status = runtime_status()
    assert set(status) == {"onnxruntime", "litert", "openvino", "llama_cpp", "openvino_genai"}
    assert status["llama_cpp"]["devices"][0] == "CPU"  # a generative runtime reports the same
    assert status["openvino_genai"]["devices"][0] == "CPU"
    assert status["onnxruntime"]["available"] is True
    assert "CPUExecutionProvider" in status["onnxruntime"]["devices"]
