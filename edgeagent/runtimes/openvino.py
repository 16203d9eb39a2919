"""OpenVINO plugin: CPU, GPU, NPU or AUTO, with the compiled-model cache and an honest precision.

On CPUs with AMX or AVX-512 BF16, OpenVINO's default inference precision is bf16, so an "FP32"
model would quietly lose accuracy. The precision hint is therefore always set from the variant
(fp32 → f32, fp16 → f16) and read back from the compiled model, which is what ``precision``
reports. INT8 (QDQ) models keep their quantized layers in int8; the hint covers the rest.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from edgeagent.runtimes.base import (
    InferenceError,
    LoadRequest,
    Runtime,
    RuntimeLoadError,
    RuntimeUnavailable,
    Session,
    TensorInfo,
    TensorNames,
    default_threads,
    logical_shape,
    to_layout,
)
from edgeagent.runtimes.facts import RUNTIME_FACTS, weights_file

# ``import openvino`` initialises the converter's telemetry, which writes a client id under
# ~/intel and sends an event. Hiding the optional openvino_telemetry package makes OpenVINO use
# its built-in no-op stub: nothing written to a (read-only) home, nothing sent.
sys.modules.setdefault("openvino_telemetry", None)  # type: ignore[arg-type]
try:
    import openvino as ov
except ImportError as exc:
    raise RuntimeUnavailable(
        f"openvino is not installed (pip install 'edgeagent[openvino]'): {exc}"
    ) from exc

_PRECISION_HINTS = {"fp32": "f32", "fp16": "f16", "int8": "f32"}


def _dims(partial_shape: Any) -> tuple[int, ...]:
    return tuple(d.get_length() if d.is_static else -1 for d in partial_shape)


def _dtype(element_type: Any) -> str:
    try:
        return str(np.dtype(element_type.to_dtype()))
    except (TypeError, AttributeError, RuntimeError):
        return element_type.get_type_name()


# Names that choose among the devices rather than name one (``lists`` cannot tell for them).
VIRTUAL_DEVICES = ("AUTO", "MULTI", "HETERO", "BATCH")


class OpenVINOSession(Session):
    runtime = "openvino"

    def __init__(self, model: Any, compiled: Any, request: LoadRequest, device: str) -> None:
        self._compiled = compiled
        self._request = compiled.create_infer_request()
        self._layout = request.layout
        self._lock = threading.Lock()  # one InferRequest, used by one thread at a time
        self.device = device
        # The precision the compiled model really computes in, for status and tests.
        self.inference_precision = _PRECISION_HINTS.get(request.precision, "f32")
        if device == "CPU":
            hint = compiled.get_property("INFERENCE_PRECISION_HINT")
            self.inference_precision = getattr(hint, "get_type_name", lambda: str(hint))()
        self.precision = request.precision
        self._in = TensorNames(
            [p.get_any_name() for p in compiled.inputs], request.input_names, "input"
        )
        # Output names from the model as read, not as compiled: compiling folds a final
        # Identity and its port may then answer to the tensor before it ("linear", not "logits").
        self._out = TensorNames(
            [p.get_any_name() for p in model.outputs], request.output_names, "output"
        )

    @property
    def inputs(self) -> list[TensorInfo]:
        return [
            TensorInfo(
                name,
                _dtype(port.get_element_type()),
                logical_shape(_dims(port.get_partial_shape()), self._layout),
            )
            for name, port in zip(self._in.logical, self._compiled.inputs, strict=True)
        ]

    @property
    def outputs(self) -> list[TensorInfo]:
        return [
            TensorInfo(name, _dtype(port.get_element_type()), _dims(port.get_partial_shape()))
            for name, port in zip(self._out.logical, self._compiled.outputs, strict=True)
        ]

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        arrays = [to_layout(a, self._layout) for a in self._in.bind(feeds)]
        with self._lock:
            try:
                result = self._request.infer(dict(enumerate(arrays)))
            except RuntimeError as exc:
                raise InferenceError(f"OpenVINO ({self.device}): {exc}") from exc
            values = [np.array(result[port], copy=True) for port in self._compiled.outputs]
        return self._out.name_outputs(values)

    def close(self) -> None:
        self._request = None
        self._compiled = None


class OpenVINORuntime(Runtime):
    name = "openvino"

    def __init__(self) -> None:
        self._core = ov.Core()

    def version(self) -> str:
        return str(ov.get_version())

    def devices(self) -> list[str]:
        return list(self._core.available_devices)

    def lists(self, device: str) -> bool | None:
        """``GPU`` is listed as ``GPU.0``, ``GPU.1`` on a machine with two; AUTO, MULTI,
        HETERO and BATCH are not devices but ways of choosing among them."""
        name = device.upper()
        if name.split(":")[0] in VIRTUAL_DEVICES:
            return None
        return any(d.upper() == name or d.upper().startswith(name + ".") for d in self.devices())

    def load(self, request: LoadRequest) -> OpenVINOSession:
        found = request.file(RUNTIME_FACTS[self.name].model_suffixes)
        if found is None:
            raise RuntimeLoadError("OpenVINO needs an .xml (with its .bin) or an .onnx file")
        model_file, content = found
        device = request.device.upper()
        config: dict[str, Any] = {"PERFORMANCE_HINT": "LATENCY"}
        if device in ("CPU", "GPU"):
            config["INFERENCE_PRECISION_HINT"] = _PRECISION_HINTS.get(request.precision, "f32")
        if device == "CPU":
            config["INFERENCE_NUM_THREADS"] = request.threads or default_threads()
        if request.cache_dir is not None:
            request.cache_dir.mkdir(parents=True, exist_ok=True)
            config["CACHE_DIR"] = str(request.cache_dir)
        config.update({str(k): v for k, v in request.options.items()})
        if content is not None:  # the compiled-model cache would write the model to disk
            config.pop("CACHE_DIR", None)
        try:
            model = self._read(model_file, content, request)
            compiled = self._core.compile_model(model, device, config)
        except RuntimeError as exc:
            raise RuntimeLoadError(
                f"OpenVINO could not compile {model_file.name} for {device}: {_first_lines(exc)}"
            ) from exc
        actual = device
        if device.startswith(("AUTO", "MULTI", "HETERO")):
            actual = ",".join(compiled.get_property("EXECUTION_DEVICES")) or device
        return OpenVINOSession(model, compiled, request, actual)

    def _read(self, model_file: Path, content: bytes | None, request: LoadRequest) -> Any:
        """The model from its file, or from memory: IR as xml bytes + a weights Tensor, ONNX
        as its bytes (OpenVINO's read_model(model=bytes, weights=Tensor))."""
        if content is None:
            return self._core.read_model(str(model_file))
        beside = weights_file(model_file)  # an IR .xml: its .bin; an .onnx: none
        weights = request.file((beside.suffix,)) if beside is not None else None
        blob = weights[1] if weights is not None and weights[1] is not None else b""
        return self._core.read_model(
            model=content, weights=ov.Tensor(np.frombuffer(blob, dtype=np.uint8))
        )


def _first_lines(exc: Exception, count: int = 3) -> str:
    """OpenVINO errors nest "Exception from src/…" frames; the lines after them say what failed."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    meaningful = [line for line in lines if not line.startswith("Exception from src/")]
    return " ".join((meaningful or lines)[:count])


def create() -> OpenVINORuntime:
    return OpenVINORuntime()
