"""LiteRT (TensorFlow Lite) plugin: XNNPACK on the CPU, or an external delegate (Edge TPU, Teflon…).

``ai_edge_litert`` is preferred; ``tflite_runtime`` is the fallback on boards whose Python or
numpy the newer wheel does not support. Fully-integer models take int8/uint8 inputs: the session
quantizes float inputs and dequantizes outputs with the scale and zero point stored in the file,
so callers always exchange float tensors whatever the variant.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Mapping
from typing import Any

import numpy as np

from edgeagent.logs import native_output
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
from edgeagent.runtimes.facts import RUNTIME_FACTS

try:
    from ai_edge_litert import interpreter as _interpreter

    _PACKAGE = "ai-edge-litert"
except ImportError:
    try:
        from tflite_runtime import interpreter as _interpreter

        _PACKAGE = "tflite-runtime"
    except ImportError as exc:
        raise RuntimeUnavailable(
            "neither ai-edge-litert nor tflite-runtime is installed "
            "(pip install 'edgeagent[litert]')"
        ) from exc

EDGETPU_LIBRARY = "libedgetpu.so.1"


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(_PACKAGE)
    except PackageNotFoundError:  # pragma: no cover - vendored builds
        return "unknown"


def _quantize(values: np.ndarray, detail: Mapping[str, Any]) -> np.ndarray:
    dtype = np.dtype(detail["dtype"])
    if dtype.kind == "f":
        return values.astype(dtype, copy=False)
    scale, zero_point = detail["quantization"]
    if scale == 0:  # an integer tensor that is not quantized: pass the values through
        return values.astype(dtype)
    info = np.iinfo(dtype)
    scaled = np.multiply(values, np.float32(1.0 / scale), dtype=np.float32)
    scaled += np.float32(zero_point)
    np.rint(scaled, out=scaled)
    np.clip(scaled, info.min, info.max, out=scaled)
    return scaled.astype(dtype)


def _dequantize(values: np.ndarray, detail: Mapping[str, Any]) -> np.ndarray:
    scale, zero_point = detail["quantization"]
    if np.dtype(detail["dtype"]).kind == "f" or scale == 0:
        return values
    return ((values.astype(np.float32) - zero_point) * scale).astype(np.float32)


VARIABLE_OPS = frozenset({"VAR_HANDLE", "READ_VARIABLE", "ASSIGN_VARIABLE"})


def holds_variables(interpreter: Any) -> bool:
    """Whether the graph keeps state in resource variables between invokes."""
    try:
        ops = interpreter._get_ops_details()
    except (AttributeError, RuntimeError, ValueError):  # an older tflite_runtime: assume not
        return False
    return any(op.get("op_name") in VARIABLE_OPS for op in ops)


class LiteRTSession(Session):
    runtime = "litert"

    def __init__(self, interpreter: Any, request: LoadRequest, device: str) -> None:
        self._interpreter = interpreter
        self._request = request  # what fork() loads again
        self._layout = request.layout
        self._lock = threading.Lock()  # an Interpreter must not be entered by two threads
        self.device = device
        self.precision = request.precision
        self._in_details = interpreter.get_input_details()
        self._out_details = interpreter.get_output_details()
        self._in = TensorNames([d["name"] for d in self._in_details], request.input_names, "input")
        self._out = TensorNames(
            [d["name"] for d in self._out_details], request.output_names, "output"
        )
        self._batch = int(self._in_details[0]["shape"][0])
        # Resizing the inputs of a graph with resource variables re-allocates them: LiteRT
        # crashes (a double free) or resets the state, so such a graph runs row by row.
        self._resizable = not holds_variables(interpreter)

    @property
    def inputs(self) -> list[TensorInfo]:
        return [
            TensorInfo(name, "float32", (-1, *logical_shape(d["shape"], self._layout)[1:]))
            for name, d in zip(self._in.logical, self._in_details, strict=True)
        ]

    @property
    def outputs(self) -> list[TensorInfo]:
        return [
            TensorInfo(name, "float32", (-1, *tuple(int(x) for x in d["shape"][1:])))
            for name, d in zip(self._out.logical, self._out_details, strict=True)
        ]

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        # Quantize before the layout transpose: moving int8 is a quarter of moving float32.
        arrays = [
            to_layout(_quantize(array, detail), self._layout)
            for array, detail in zip(self._in.bind(feeds), self._in_details, strict=True)
        ]
        size = arrays[0].shape[0]
        with self._lock:
            try:
                outputs = None
                if self._resizable and self._ensure_batch(size):
                    outputs = self._invoke(arrays)
                    if any(len(o) != size for o in outputs):
                        # The input resized but a reshape inside keeps batch 1 (MediaPipe's
                        # models do): its answer covers one row only, so go row by row.
                        self._resizable = False
                        self._restore_batch_one()
                        outputs = None
                if outputs is None:  # a graph with a baked-in batch size: one row at a time
                    rows = [self._invoke([a[i : i + 1] for a in arrays]) for i in range(size)]
                    outputs = [np.concatenate(parts) for parts in zip(*rows, strict=True)]
            except (RuntimeError, ValueError) as exc:
                raise InferenceError(f"LiteRT ({self.device}): {exc}") from exc
        return self._out.name_outputs(outputs)

    def _ensure_batch(self, size: int) -> bool:
        """Resize the input tensors to ``size``; False when the graph refuses another batch."""
        if size == self._batch:
            return True
        try:
            for detail in self._in_details:
                shape = [size, *list(detail["shape"][1:])]
                self._interpreter.resize_tensor_input(detail["index"], shape, strict=False)
            self._interpreter.allocate_tensors()
        except (RuntimeError, ValueError):
            self._resizable = False
            self._restore_batch_one()
            return False
        self._batch = size
        self._in_details = self._interpreter.get_input_details()
        self._out_details = self._interpreter.get_output_details()
        return True

    def _restore_batch_one(self) -> None:
        for detail in self._in_details:
            shape = [1, *list(detail["shape"][1:])]
            self._interpreter.resize_tensor_input(detail["index"], shape, strict=False)
        self._interpreter.allocate_tensors()
        self._batch = 1
        self._in_details = self._interpreter.get_input_details()
        self._out_details = self._interpreter.get_output_details()

    def _invoke(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        for detail, array in zip(self._in_details, arrays, strict=True):
            self._interpreter.set_tensor(detail["index"], array)
        self._interpreter.invoke()
        return [_dequantize(self._interpreter.get_tensor(d["index"]), d) for d in self._out_details]

    def close(self) -> None:
        self._interpreter = None

    def fork(self) -> LiteRTSession:
        """A new interpreter of the same file: resource variables start at their initial
        values, apart from this one's."""
        return LiteRTRuntime().load(self._request)


class LiteRTRuntime(Runtime):
    name = "litert"

    def version(self) -> str:
        return _package_version()

    def devices(self) -> list[str]:
        # Delegates cannot be listed without loading them; CPU (XNNPACK) is always there.
        return ["CPU"]

    def lists(self, device: str) -> bool | None:
        """CPU always; the Edge TPU where its delegate library (libedgetpu) can be opened —
        without it the delegate cannot load, though with it the TPU may still be absent; any
        other delegate only a probe can tell."""
        name = device.upper()
        if name == "CPU":
            return True
        if name != "EDGETPU":
            return None
        try:
            ctypes.CDLL(EDGETPU_LIBRARY)
        except OSError:
            return False
        return None

    def load(self, request: LoadRequest) -> LiteRTSession:
        found = request.file(RUNTIME_FACTS[self.name].model_suffixes)
        if found is None:
            raise RuntimeLoadError("LiteRT needs a .tflite file")
        model, content = found
        source = {"model_path": str(model)} if content is None else {"model_content": content}
        device = request.device.upper()
        if device not in ("CPU", "EDGETPU", "DELEGATE"):
            raise RuntimeLoadError(
                f"LiteRT has no device {request.device!r} (CPU, EDGETPU, DELEGATE)"
            )
        with native_output("litert"):  # "INFO: Created TensorFlow Lite XNNPACK delegate …"
            delegates = [] if device == "CPU" else [self._load_delegate(device, request.options)]
            try:
                interpreter = _interpreter.Interpreter(
                    **source,
                    num_threads=request.threads or default_threads(),
                    experimental_delegates=delegates or None,
                )
                interpreter.allocate_tensors()
            except (RuntimeError, ValueError) as exc:
                raise RuntimeLoadError(f"LiteRT could not load {model.name}: {exc}") from exc
        return LiteRTSession(interpreter, request, device)

    @staticmethod
    def _load_delegate(device: str, options: Mapping[str, Any]) -> Any:
        library = options.get("delegate") or (EDGETPU_LIBRARY if device == "EDGETPU" else None)
        if not library:
            raise RuntimeLoadError("LiteRT device DELEGATE needs options.delegate (library path)")
        delegate_options = {str(k): str(v) for k, v in options.get("delegate_options", {}).items()}
        if device == "EDGETPU" and "device" in options:
            delegate_options.setdefault("device", str(options["device"]))
        try:
            # Open the library first: a Delegate whose library is missing raises again from its
            # own __del__ (an ai-edge-litert bug), which would print a stray traceback.
            ctypes.CDLL(library)
            return _interpreter.load_delegate(library, delegate_options)
        except (ValueError, OSError, RuntimeError) as exc:
            raise RuntimeLoadError(f"LiteRT could not load delegate {library}: {exc}") from exc


def create() -> LiteRTRuntime:
    return LiteRTRuntime()
