"""onnxruntime plugin: any execution provider by name, proven rather than assumed.

onnxruntime silently falls back to the CPU when a requested provider cannot start (a CUDA
provider listed but no driver, TensorRT without its libraries). A session that does not really
run on the requested provider is therefore refused here, with onnxruntime's own account of what
it runs instead, so that probing above this layer never mistakes a CPU run for an accelerator.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
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
    import onnxruntime as ort
except ImportError as exc:  # pragma: no cover - onnxruntime is a base dependency
    raise RuntimeUnavailable(f"onnxruntime is not installed: {exc}") from exc

log = logging.getLogger(__name__)

CPU = "CPUExecutionProvider"
# ONNX element types → numpy dtype names, for metadata.
_ONNX_TYPES = {
    "tensor(float)": "float32",
    "tensor(float16)": "float16",
    "tensor(double)": "float64",
    "tensor(int8)": "int8",
    "tensor(uint8)": "uint8",
    "tensor(int16)": "int16",
    "tensor(int32)": "int32",
    "tensor(int64)": "int64",
    "tensor(bool)": "bool",
}
# Providers that keep engine/blob caches, and the option that points them at our cache dir.
_CACHE_OPTIONS = {
    "TensorrtExecutionProvider": ("trt_engine_cache_path", "trt_engine_cache_enable"),
    "OpenVINOExecutionProvider": ("cache_dir", None),
}


def _shape(dims: Sequence[Any]) -> tuple[int, ...]:
    return tuple(d if isinstance(d, int) and d > 0 else -1 for d in dims)


class OnnxSession(Session):
    runtime = "onnxruntime"

    def __init__(self, session: ort.InferenceSession, request: LoadRequest) -> None:
        self._session = session
        self._layout = request.layout
        self.device = session.get_providers()[0]
        self.precision = request.precision
        native_in = session.get_inputs()
        native_out = session.get_outputs()
        self._in = TensorNames([t.name for t in native_in], request.input_names, "input")
        self._out = TensorNames([t.name for t in native_out], request.output_names, "output")
        self._input_info = [
            TensorInfo(name, _ONNX_TYPES.get(t.type, t.type), logical_shape(_shape(t.shape), None))
            for name, t in zip(self._in.logical, native_in, strict=True)
        ]
        self._output_info = [
            TensorInfo(name, _ONNX_TYPES.get(t.type, t.type), _shape(t.shape))
            for name, t in zip(self._out.logical, native_out, strict=True)
        ]

    @property
    def inputs(self) -> list[TensorInfo]:
        return self._input_info

    @property
    def outputs(self) -> list[TensorInfo]:
        return self._output_info

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        arrays = self._in.bind(feeds)
        native = {
            name: to_layout(array, self._layout)
            for name, array in zip(self._in.native, arrays, strict=True)
        }
        try:
            values = self._session.run(None, native)
        except Exception as exc:  # onnxruntime raises its own pybind exception types
            raise InferenceError(f"onnxruntime ({self.device}): {exc}") from exc
        return self._out.name_outputs(values)

    def close(self) -> None:
        del self._session


# Candidate options that set the session, not the execution provider.
SESSION_OPTIONS = frozenset({"allow_spinning", "spin_duration_us"})
# How long an intra-op thread spins for the next piece of work before it sleeps.
SPIN_DURATION_US = 100


def spin_entries(options: Mapping[str, Any]) -> dict[str, str]:
    """The session's spinning: briefly, unless the candidate says otherwise.

    A thread that sleeps between two operators of one run pays a wake-up for each (MobileNetV2
    has ~60); one that spins for onnxruntime's default time burns the cores the agent's HTTP
    server and the board's other work need once the run is over. Spinning for 100 µs keeps the
    first and loses the second: batch-1 p50 5.35 ms against 6.97 ms without spinning and 5.27
    ms with the default spin, at 10.9 ms of CPU a run against 11.4 and 12.9 (alternating
    rounds in one process, 2 threads, a 2 ms pause between runs as served requests have).
    ``allow_spinning = false`` turns it off; ``spin_duration_us`` sets the time.
    """
    if not options.get("allow_spinning", True):
        return {"session.intra_op.allow_spinning": "0"}
    duration = options.get("spin_duration_us", SPIN_DURATION_US)
    if not isinstance(duration, int) or isinstance(duration, bool) or duration < 0:
        raise RuntimeLoadError(
            f"spin_duration_us must be a whole number of microseconds (≥ 0), got {duration!r}"
        )
    return {
        "session.intra_op.allow_spinning": "1",
        "session.intra_op.spin_duration_us": str(duration),
    }


class OnnxRuntime(Runtime):
    name = "onnxruntime"

    def version(self) -> str:
        return str(ort.__version__)

    def devices(self) -> list[str]:
        # The Azure provider is a remote-inference shim, never a local accelerator.
        return [p for p in ort.get_available_providers() if p != "AzureExecutionProvider"]

    def lists(self, device: str) -> bool | None:
        return (CPU if device == "CPU" else device) in self.devices()

    def load(self, request: LoadRequest) -> OnnxSession:
        found = request.file(RUNTIME_FACTS[self.name].model_suffixes)
        if found is None:
            raise RuntimeLoadError("onnxruntime needs an .onnx file")
        model, content = found
        provider = request.device if request.device != "CPU" else CPU
        available = ort.get_available_providers()
        if provider not in available:
            raise RuntimeLoadError(
                f"onnxruntime {ort.__version__} has no {provider} in this build "
                f"(available: {', '.join(available)})"
            )
        options = ort.SessionOptions()
        options.intra_op_num_threads = request.threads or default_threads()
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3  # the fallback warning is reported by us, not printed
        for key, value in spin_entries(request.options).items():
            options.add_session_config_entry(key, value)
        providers: list[Any] = [(provider, self._provider_options(provider, request))]
        if provider != CPU:
            providers.append(CPU)
        try:
            # From memory when sealed; options.optimized_model_filepath stays unset either way,
            # so onnxruntime never writes the (optimised) model back to disk.
            source = content if content is not None else str(model)
            with native_output("onnxruntime"):  # a provider that fails to initialise says why
                session = ort.InferenceSession(source, sess_options=options, providers=providers)
        except Exception as exc:
            raise RuntimeLoadError(f"onnxruntime could not load {model.name}: {exc}") from exc
        actual = session.get_providers()[0]
        if actual != provider:
            raise RuntimeLoadError(
                f"onnxruntime was asked for {provider} but runs {model.name} on {actual} "
                f"(the provider failed to initialise; see onnxruntime's log)"
            )
        return OnnxSession(session, request)

    @staticmethod
    def _provider_options(provider: str, request: LoadRequest) -> dict[str, Any]:
        """The profile's options, plus a cache location for providers that build engines."""
        opts = {
            k: str(v) if isinstance(v, bool) else v
            for k, v in request.options.items()
            if k not in SESSION_OPTIONS
        }
        cache = _CACHE_OPTIONS.get(provider)
        if cache and request.contents is not None:  # an engine cache would hold the model
            for key in cache:
                if key:
                    opts.pop(key, None)
        elif cache and request.cache_dir is not None:
            path_key, enable_key = cache
            Path(request.cache_dir).mkdir(parents=True, exist_ok=True)
            opts.setdefault(path_key, str(request.cache_dir))
            if enable_key:
                opts.setdefault(enable_key, "True")
        return opts


def create() -> OnnxRuntime:
    return OnnxRuntime()
