"""llama.cpp plugin (llama-cpp-python's ctypes bindings): one context, many sequences per decode.

The high-level ``llama_cpp.Llama`` serves one sequence at a time; continuous batching needs
the C API underneath it: a context made with ``n_seq_max`` sequences sharing one KV cache
(``kv_unified``, so any sequence may use any free cell and a shared prompt prefix is stored
once), a ``llama_batch`` that carries several sequences' tokens into one ``llama_decode``, and
the logits read back per sequence. Everything is a ctypes call, which releases the GIL, so
the scheduler's thread decodes while the event loop serves.

Devices come from ggml's backend registry (CPU, and CUDA0 / Vulkan0 / Metal where the wheel
was built with them). A model whose weights plus KV cache do not fit the device's free memory
(or ``options["memory_budget_bytes"]``) is refused before the context is allocated.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgeagent.runtimes.base import (
    InferenceError,
    RuntimeLoadError,
    RuntimeUnavailable,
    default_threads,
)
from edgeagent.runtimes.facts import RUNTIME_FACTS
from edgeagent.runtimes.generative import (
    GenerativeLoadRequest,
    GenerativeRuntime,
    GenerativeSession,
    ModelFacts,
    SequenceInput,
)

try:
    import llama_cpp as lc
    from llama_cpp._ggml import libggml
except ImportError as exc:  # pragma: no cover - depends on the install
    raise RuntimeUnavailable(
        f"llama-cpp-python is not installed (pip install 'edgeagent[llm]'): {exc}"
    ) from exc

log = logging.getLogger(__name__)
NAME = "llama_cpp"
MIB = 1 << 20
# Compute buffers and scratch beyond weights and KV: llama.cpp's own graph reserve is a few
# tens of MiB for small models; counted so a refusal is not off by the obvious part.
OVERHEAD_BYTES = 64 * MIB

# ggml's backend registry (ggml-backend.h); not bound by llama-cpp-python's Python module.
_DEV_TYPES = {0: "CPU", 1: "GPU", 2: "IGPU", 3: "ACCEL"}
libggml.ggml_backend_dev_count.restype = ctypes.c_size_t
libggml.ggml_backend_dev_get.argtypes = [ctypes.c_size_t]
libggml.ggml_backend_dev_get.restype = ctypes.c_void_p
libggml.ggml_backend_dev_name.argtypes = [ctypes.c_void_p]
libggml.ggml_backend_dev_name.restype = ctypes.c_char_p
libggml.ggml_backend_dev_type.argtypes = [ctypes.c_void_p]
libggml.ggml_backend_dev_type.restype = ctypes.c_int
libggml.ggml_backend_dev_memory.argtypes = [
    ctypes.c_void_p,
    ctypes.POINTER(ctypes.c_size_t),
    ctypes.POINTER(ctypes.c_size_t),
]
libggml.ggml_backend_dev_memory.restype = None


@lc.llama_log_callback
def _log_callback(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    """llama.cpp's log into ours: errors and warnings kept, its chatty loading at debug.

    ggml's levels: 1 debug, 2 info, 3 warn, 4 error, 5 a continued line."""
    message = text.decode("utf-8", "replace").rstrip()
    if message:
        log.log({3: logging.WARNING, 4: logging.ERROR}.get(level, logging.DEBUG), "%s", message)


_init_lock = threading.Lock()
_initialised = False


def _init_backend() -> None:
    global _initialised
    with _init_lock:
        if not _initialised:
            lc.llama_log_set(_log_callback, ctypes.c_void_p(0))
            lc.llama_backend_init()
            _initialised = True


def backend_devices() -> dict[str, tuple[str, int, int]]:
    """Every device in ggml's registry: name → (type, free bytes, total bytes)."""
    _init_backend()
    found = {}
    for index in range(libggml.ggml_backend_dev_count()):
        device = libggml.ggml_backend_dev_get(index)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        libggml.ggml_backend_dev_memory(device, ctypes.byref(free), ctypes.byref(total))
        name = libggml.ggml_backend_dev_name(device).decode()
        kind = _DEV_TYPES.get(libggml.ggml_backend_dev_type(device), "OTHER")
        found[name] = (kind, int(free.value), int(total.value))
    return found


def _meta(model: Any, key: str) -> str | None:
    size = lc.llama_model_meta_val_str(model, key.encode(), None, 0)
    if size < 0:
        return None
    buffer = ctypes.create_string_buffer(size + 1)
    lc.llama_model_meta_val_str(model, key.encode(), buffer, size + 1)
    return buffer.value.decode("utf-8", "replace")


def _facts(model: Any, vocab: Any, path: Path) -> ModelFacts:
    architecture = _meta(model, "general.architecture") or "unknown"
    template = lc.llama_model_chat_template(model, None)
    ftype = lc.llama_ftype_name(lc.llama_model_ftype(model))
    quantization = (ftype or b"").decode().split()[-1] if ftype else ""

    def text(token: int) -> str:
        return (
            lc.llama_vocab_get_text(vocab, token).decode("utf-8", "replace") if token >= 0 else ""
        )

    return ModelFacts(
        architecture=architecture,
        context_trained=int(lc.llama_model_n_ctx_train(model)),
        vocabulary=int(lc.llama_vocab_n_tokens(vocab)),
        parameters=int(lc.llama_model_n_params(model)),
        size_bytes=int(lc.llama_model_size(model)) or path.stat().st_size,
        chat_template=template.decode("utf-8") if template else None,
        bos_token=text(lc.llama_vocab_bos(vocab)),
        eos_token=text(lc.llama_vocab_eos(vocab)),
        quantization=quantization.upper() if quantization not in ("F32", "all") else quantization,
        embedding_length=int(lc.llama_model_n_embd(model)),
    )


def kv_bytes_per_token(model: Any) -> int:
    """f16 K and V of every layer for one token: layers × kv heads × head size × 2 × 2 bytes."""
    heads = max(1, lc.llama_model_n_head(model))
    head_size = lc.llama_model_n_embd(model) // heads
    return int(lc.llama_model_n_layer(model) * lc.llama_model_n_head_kv(model) * head_size * 4)


class LlamaCppSession(GenerativeSession):
    """One model, one context of ``sequences`` sequences over one unified KV cache."""

    runtime = NAME

    def __init__(self, model: Any, request: GenerativeLoadRequest, device: str) -> None:
        self._model = model
        self._vocab = lc.llama_model_get_vocab(model)
        self.device = device
        self.facts = _facts(model, self._vocab, request.files[0])
        self.context = request.context
        self.sequences = request.sequences
        self.batch_tokens = request.batch_tokens
        self._per_token = kv_bytes_per_token(model)
        params = lc.llama_context_default_params()
        params.n_ctx = request.context
        params.n_batch = request.batch_tokens
        params.n_ubatch = request.batch_tokens
        # One spare sequence for embeddings and probes, never handed to the scheduler.
        params.n_seq_max = request.sequences + 1
        params.kv_unified = True
        params.n_threads = params.n_threads_batch = request.threads or default_threads()
        params.embeddings = request.embedding
        if request.embedding:  # the file's own pooling; a decoder-only model's: the mean
            pooling = _meta(model, f"{self.facts.architecture}.pooling_type")
            params.pooling_type = int(pooling) if pooling else lc.LLAMA_POOLING_TYPE_MEAN
        params.no_perf = True
        self._ctx = lc.llama_init_from_model(model, params)
        if not self._ctx:
            lc.llama_model_free(model)
            raise RuntimeLoadError(
                f"llama.cpp could not create a context of {request.context} tokens × "
                f"{request.sequences} sequences on {device}"
            )
        self._memory = lc.llama_get_memory(self._ctx)
        self._vocab_size = self.facts.vocabulary
        self._batch = lc.llama_batch_init(request.batch_tokens, 0, 1)
        self._lengths: dict[int, int] = {}  # sequence → cached positions
        self._shared: dict[int, tuple[int, int]] = {}  # target → (source, prefix length)
        self._lock = threading.Lock()
        self._closed = False

    # ---- vocabulary -----------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool = True) -> list[int]:
        if self._closed:  # the vocabulary went with the model
            raise InferenceError("the session is closed")
        data = text.encode("utf-8")
        capacity = len(data) + 8
        buffer = (lc.llama_token * capacity)()
        count = lc.llama_tokenize(
            self._vocab, data, len(data), buffer, capacity, add_special, parse_special
        )
        if count < 0:  # never more tokens than bytes + specials, but follow the API's contract
            buffer = (lc.llama_token * -count)()
            count = lc.llama_tokenize(
                self._vocab, data, len(data), buffer, -count, add_special, parse_special
            )
        return list(buffer[:count])

    def piece(self, token: int) -> bytes:
        buffer = ctypes.create_string_buffer(64)
        size = lc.llama_token_to_piece(self._vocab, token, buffer, 64, 0, False)
        if size < 0:
            buffer = ctypes.create_string_buffer(-size)
            size = lc.llama_token_to_piece(self._vocab, token, buffer, -size, 0, False)
        return buffer.raw[:size]

    def is_end(self, token: int) -> bool:
        return bool(lc.llama_vocab_is_eog(self._vocab, token))

    # ---- the batch ------------------------------------------------------------------------

    def _check(self, sequence: int, scheduler: bool = True) -> None:
        top = self.sequences if scheduler else self.sequences + 1
        if not 0 <= sequence < top:
            raise InferenceError(f"sequence {sequence} is outside 0..{top - 1}")

    def step(self, inputs: Sequence[SequenceInput]) -> dict[int, np.ndarray]:
        """Decode every input's tokens; split over several ``llama_decode`` only when they
        exceed the context's batch (the scheduler keeps a step within it)."""
        for item in inputs:
            self._check(item.sequence)
            if not item.tokens:
                raise InferenceError(f"sequence {item.sequence}: no tokens to feed")
        return self._decode(inputs)

    def _decode(
        self, inputs: Sequence[SequenceInput], every_output: bool = False
    ) -> dict[int, np.ndarray]:
        """``every_output``: every token's state is an output (pooled embeddings need them)."""
        with self._lock:
            if self._closed:
                raise InferenceError("the session is closed")
            flat = [
                (item.sequence, token, item.position + offset, offset == len(item.tokens) - 1)
                for item in inputs
                for offset, token in enumerate(item.tokens)
            ]
            logits: dict[int, np.ndarray] = {}
            batch = self._batch
            for start in range(0, len(flat), self.batch_tokens):
                part = flat[start : start + self.batch_tokens]
                outputs: list[tuple[int, int]] = []
                for index, (sequence, token, position, last) in enumerate(part):
                    batch.token[index] = token
                    batch.pos[index] = position
                    batch.n_seq_id[index] = 1
                    batch.seq_id[index][0] = sequence
                    batch.logits[index] = last or every_output
                    if last:
                        outputs.append((sequence, index))
                batch.n_tokens = len(part)
                status = lc.llama_decode(self._ctx, batch)
                if status != 0:
                    reason = {1: "no free KV-cache slot for the batch", 2: "aborted"}
                    raise InferenceError(
                        f"llama_decode failed ({status}): {reason.get(status, 'error')} "
                        f"({len(part)} tokens, {len(self._lengths)} sequences cached)"
                    )
                for sequence, index in outputs:
                    row = lc.llama_get_logits_ith(self._ctx, index)
                    logits[sequence] = np.ctypeslib.as_array(row, (self._vocab_size,)).copy()
            for item in inputs:
                end = item.position + len(item.tokens)
                self._lengths[item.sequence] = max(self._lengths.get(item.sequence, 0), end)
            return logits

    def free(self, sequence: int) -> None:
        with self._lock:
            if self._closed:
                return
            lc.llama_memory_seq_rm(self._memory, sequence, -1, -1)
            self._lengths.pop(sequence, None)
            self._shared.pop(sequence, None)

    def copy_prefix(self, source: int, target: int, length: int) -> None:
        self._check(source)
        self._check(target)
        with self._lock:
            lc.llama_memory_seq_rm(self._memory, target, -1, -1)
            lc.llama_memory_seq_cp(self._memory, source, target, 0, length)
            self._lengths[target] = length
            self._shared[target] = (source, length)

    def kv_bytes(self) -> tuple[int, int]:
        """Cells in use × bytes per cell; a prefix shared by copy_prefix is counted once."""
        with self._lock:
            cells = sum(self._lengths.values())
            for source, length in self._shared.values():
                if self._lengths.get(source, 0) >= length:
                    cells -= length
            return cells * self._per_token, self.context * self._per_token

    def embed(self, tokens: Sequence[int]) -> np.ndarray:
        """Pooled embedding of ``tokens`` on the spare sequence (embedding loads only)."""
        if not lc.llama_pooling_type(self._ctx) > 0:
            return super().embed(tokens)
        spare = self.sequences
        if len(tokens) > self.batch_tokens:
            raise InferenceError(f"{len(tokens)} tokens exceed the batch of {self.batch_tokens}")
        try:
            self._decode([SequenceInput(spare, tuple(tokens), 0)], every_output=True)
            with self._lock:
                row = lc.llama_get_embeddings_seq(self._ctx, spare)
                size = self.facts.embedding_length
                return np.ctypeslib.as_array(row, (size,)).copy()
        finally:
            self.free(spare)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            lc.llama_batch_free(self._batch)
            lc.llama_free(self._ctx)
            lc.llama_model_free(self._model)


class LlamaCppRuntime(GenerativeRuntime):
    name = NAME

    def version(self) -> str:
        return str(lc.__version__)

    def devices(self) -> list[str]:
        """CPU first, then the accelerators ggml was built with (CUDA0, Vulkan0, Metal …)."""
        return ["CPU", *(n for n, (kind, *_) in backend_devices().items() if kind != "CPU")]

    def load(self, request: GenerativeLoadRequest) -> LlamaCppSession:
        found = [f for f in request.files if f.suffix in RUNTIME_FACTS[NAME].model_suffixes]
        if not found:
            raise RuntimeLoadError("llama.cpp needs a .gguf file")
        if request.context < 1 or request.sequences < 1 or request.batch_tokens < 1:
            raise RuntimeLoadError("context, sequences and batch_tokens must be at least 1")
        path = found[0]
        devices = backend_devices()
        accelerators = {n: v for n, v in devices.items() if v[0] != "CPU"}
        if request.device != "CPU" and request.device not in accelerators:
            raise RuntimeLoadError(
                f"llama.cpp {lc.__version__} has no device {request.device!r} in this build "
                f"(devices: {', '.join(self.devices())})"
            )
        _init_backend()
        params = lc.llama_model_default_params()
        params.n_gpu_layers = 0 if request.device == "CPU" else 999
        if request.device != "CPU":
            params.main_gpu = list(accelerators).index(request.device)
        model = lc.llama_model_load_from_file(str(path).encode(), params)
        if not model:
            raise RuntimeLoadError(f"llama.cpp could not load {path.name} (see the log)")
        try:
            self._fits(model, path, request, devices)
        except RuntimeLoadError:
            lc.llama_model_free(model)
            raise
        return LlamaCppSession(model, request, request.device)

    @staticmethod
    def _fits(
        model: Any,
        path: Path,
        request: GenerativeLoadRequest,
        devices: dict[str, tuple[str, int, int]],
    ) -> None:
        """Refuse a model whose weights + KV cache + overhead exceed the memory budget."""
        weights = int(lc.llama_model_size(model)) or path.stat().st_size
        kv = kv_bytes_per_token(model) * request.context
        need = weights + kv + OVERHEAD_BYTES
        budget = request.options.get("memory_budget_bytes")
        where = "the configured budget"
        if budget is None:
            cpu = next((v for v in devices.values() if v[0] == "CPU"), None)
            _, free, _ = devices.get(request.device, cpu or ("CPU", 0, 0))
            budget, where = free, f"free memory on {request.device}"
        if budget and need > int(budget):
            raise RuntimeLoadError(
                f"{path.name} needs {need / MIB:.0f} MiB (weights {weights / MIB:.0f} MiB + KV "
                f"cache {kv / MIB:.0f} MiB for {request.context} tokens + {OVERHEAD_BYTES // MIB}"
                f" MiB compute) but {where} is {int(budget) / MIB:.0f} MiB"
            )


def quantize(source: Path, target: Path, precision: str, threads: int | None = None) -> Path:
    """llama.cpp's own quantizer: ``source`` (f16/f32 GGUF) → ``target`` at ``precision``
    (a gguf ``LlamaFileType`` name in lower case: q8_0, q4_k_m …)."""
    from gguf import LlamaFileType

    try:
        file_type = LlamaFileType[f"MOSTLY_{precision.upper()}"]
    except KeyError:
        problem = f"{precision!r} is not a llama.cpp quantization (q8_0, q4_k_m …)"
        raise RuntimeLoadError(problem) from None
    params = lc.llama_model_quantize_default_params()
    params.ftype = int(file_type)
    params.nthread = threads or default_threads()
    _init_backend()
    failed = lc.llama_model_quantize(
        str(source).encode(), str(target).encode(), ctypes.byref(params)
    )
    if failed or not target.is_file():
        raise RuntimeLoadError(f"llama.cpp could not quantize {source.name} to {precision}")
    return target


def create() -> LlamaCppRuntime:
    return LlamaCppRuntime()
