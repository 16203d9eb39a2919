"""OpenVINO GenAI plugin: its ContinuousBatchingPipeline behind the generating contract.

OpenVINO GenAI samples inside its pipelines and exposes no per-step logits, so this is a
``GeneratingSession`` (runtimes.generative): the scheduler begins whole generations on
sequences and advances them all by one ``step()`` of the pipeline's own continuous batching
(paged KV cache, prefill split with decodes, prefix caching), reading each request's new
tokens from its handle. Text comes from the pipeline's own detokenizer, incrementally: a
window of recent tokens is decoded and only text that cannot change any more is released, so
a character split over tokens arrives whole.

A variant is an OpenVINO IR folder as GenAI reads it (openvino_model.xml/.bin and the
tokenizer/detokenizer IRs; ``edgeagent package`` writes one from a GGUF or a Hugging Face
folder), or a GGUF file, which GenAI converts to that IR when it loads it. Devices are
OpenVINO's (CPU, GPU …; its NPU plugin has no paged KV cache, so no continuous batching, and
is not offered). A model whose weights plus KV cache exceed the memory budget is refused
before the pipeline is built.
"""

from __future__ import annotations

import math
import os
import tempfile
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgeagent.runtimes import generative as gen
from edgeagent.runtimes.base import InferenceError, RuntimeLoadError, RuntimeUnavailable
from edgeagent.runtimes.base import default_threads as _default_threads

try:
    import openvino as ov
    import openvino_genai as ovg
except ImportError as exc:  # pragma: no cover - depends on the install
    raise RuntimeUnavailable(
        f"openvino-genai is not installed (pip install 'edgeagent[llm-openvino]'): {exc}"
    ) from exc

NAME = "openvino_genai"
MIB = 1 << 20
MODEL_XML = "openvino_model.xml"
# Tokens per KV-cache block of OpenVINO's paged attention: 32 on its CPU plugin, 16 on GPU.
BLOCK_TOKENS = {"CPU": 32}
DEFAULT_BLOCK_TOKENS = 16
OVERHEAD_BYTES = 64 * MIB  # compute buffers beyond weights and KV, as the llama.cpp plugin counts
DECODE_WINDOW = 6  # tokens decoded again before the new one: enough to complete a character
_DONE = {"FINISHED", "STOP", "CANCEL", "IGNORED"}


class IncrementalText:
    """One generation's text from its tokens as they come, whole characters only.

    GenAI's detokenizer decodes a list of ids; a character split over tokens decodes to
    nothing (or U+FFFD) until its last token is there. So each new token, the last few
    tokens are decoded with and without it, and only the difference is released, and only
    once it does not end in an incomplete character."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self.tokens: list[int] = []
        self._released = 0  # tokens whose text was released (the window starts before them)

    def add(self, tokens: Sequence[int]) -> bytes:
        """The text the new ``tokens`` complete, UTF-8."""
        self.tokens.extend(tokens)
        start = max(0, self._released - DECODE_WINDOW)
        window = self._tokenizer.decode(self.tokens[start:], skip_special_tokens=True)
        if window.endswith("\ufffd"):
            return b""  # a character still incomplete: wait for the next token
        earlier = self._tokenizer.decode(
            self.tokens[start : self._released], skip_special_tokens=True
        )
        self._released = len(self.tokens)
        return window[len(earlier) :].encode("utf-8")


@dataclass
class _Running:
    handle: Any
    text: IncrementalText


def _available_bytes() -> int:
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):  # pragma: no cover - not Linux
        return 0


def _model_dir(files: Sequence[Path]) -> Path:
    """The IR folder (the folder of openvino_model.xml) or the GGUF file GenAI converts."""
    for path in files:
        if path.name == MODEL_XML:
            return path.parent
    for path in files:
        if path.suffix == ".gguf":
            return path
    raise RuntimeLoadError(f"OpenVINO GenAI needs {MODEL_XML} (with its tokenizer IRs) or a .gguf")


def _shape_facts(source: Path) -> tuple[int, int]:
    """(vocabulary, parameters) read from the IR's graph: the logits' last dimension and the
    elements of its weight matrices (0, 0 for a GGUF, which GenAI converts in memory)."""
    if not source.is_dir():
        return 0, 0
    model = ov.Core().read_model(str(source / MODEL_XML))
    logits = model.outputs[0].get_partial_shape()
    vocabulary = logits[-1].get_length() if logits[-1].is_static else 0
    parameters = 0
    for op in model.get_ordered_ops():
        shape = list(op.get_output_shape(0)) if op.get_type_name() == "Constant" else []
        if len(shape) >= 2 and shape[-1] > 1:  # weights; not a quantization's scales (…, 1)
            parameters += math.prod(shape)
    return vocabulary, parameters


class OpenVinoGenAISession(gen.GeneratingSession):
    """One model in one ContinuousBatchingPipeline with a KV cache of ``context`` tokens."""

    runtime = NAME

    def __init__(self, request: gen.GenerativeLoadRequest, source: Path, device: str) -> None:
        self.device = device
        self.sequences = request.sequences
        block = BLOCK_TOKENS.get(device, DEFAULT_BLOCK_TOKENS)
        blocks = math.ceil(request.context / block)
        self.context = blocks * block
        scheduler = ovg.SchedulerConfig()
        scheduler.num_kv_blocks = blocks
        scheduler.max_num_seqs = request.sequences
        scheduler.max_num_batched_tokens = max(request.batch_tokens, request.sequences)
        scheduler.dynamic_split_fuse = True  # prompt chunks ride with the decodes
        scheduler.enable_prefix_caching = True
        threads = request.threads or _default_threads()
        properties = {"INFERENCE_NUM_THREADS": threads} if device == "CPU" else {}
        self._source = source
        self._pipeline = ovg.ContinuousBatchingPipeline(str(source), scheduler, device, properties)
        self._tokenizer = self._pipeline.get_tokenizer()
        config = self._pipeline.get_config()
        self._ends = {int(t) for t in config.stop_token_ids} | {int(config.eos_token_id)}
        self._ends.discard(-1)
        self._running: dict[int, _Running] = {}
        self._ids = 0
        self._lock = threading.Lock()
        self._closed = False
        self._scorer: Any = None
        self._threads = threads
        weights = sum(f.stat().st_size for f in (source.iterdir() if source.is_dir() else [source]))
        options = request.options
        vocabulary, parameters = _shape_facts(source)
        self.facts = gen.ModelFacts(
            architecture=str(options.get("architecture", "unknown")),
            context_trained=int(options.get("context_trained", self.context)),
            vocabulary=vocabulary,
            parameters=parameters,
            size_bytes=weights,
            chat_template=self._tokenizer.chat_template or None,
            bos_token=self._tokenizer.get_bos_token(),
            eos_token=self._tokenizer.get_eos_token(),
            quantization=str(options.get("precision", "")).upper(),
            embedding_length=0,
        )
        self._warm_up()

    def _warm_up(self) -> None:
        """One token through the pipeline: it allocates its KV cache lazily, and the
        scheduler sizes its budget from what ``kv_bytes`` reports."""
        self.begin(0, gen.GenerationSpec(tuple(self.tokenize("Hi", add_special=True)), 1))
        try:
            for _ in range(16):  # a prompt of a few tokens and one token: two or three steps
                got = self.advance().get(0)
                if got is not None and got.finished:
                    break
        finally:
            self.free(0)

    # ---- vocabulary -----------------------------------------------------------------------

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool = True) -> list[int]:
        encoded = self._tokenizer.encode(text, add_special_tokens=add_special)
        return [int(t) for t in encoded.input_ids.data[0]]

    def piece(self, token: int) -> bytes:
        return self._tokenizer.decode([token], skip_special_tokens=False).encode("utf-8")

    def is_end(self, token: int) -> bool:
        return token in self._ends

    # ---- whole generations ----------------------------------------------------------------

    def begin(self, sequence: int, spec: gen.GenerationSpec) -> None:
        if not 0 <= sequence < self.sequences:
            raise InferenceError(f"sequence {sequence} is outside 0..{self.sequences - 1}")
        config = ovg.GenerationConfig()
        config.max_new_tokens = spec.max_tokens
        config.stop_token_ids = set(self._ends)
        if spec.temperature > 0 and spec.top_k != 1:
            config.do_sample = True
            config.temperature = spec.temperature
            config.top_p = spec.top_p
            if spec.top_k > 0:
                config.top_k = spec.top_k
            if spec.seed is not None:
                config.rng_seed = spec.seed
        prompt = ov.Tensor(np.array([spec.prompt], dtype=np.int64))
        with self._lock:
            if self._closed:
                raise InferenceError("the session is closed")
            if sequence in self._running:
                raise InferenceError(f"sequence {sequence} is running; free it first")
            self._ids += 1
            handle = self._pipeline.add_request(self._ids, prompt, config)
            self._running[sequence] = _Running(handle, IncrementalText(self._tokenizer))

    def advance(self) -> dict[int, gen.Produced]:
        with self._lock:
            if self._closed:
                raise InferenceError("the session is closed")
            if self._pipeline.has_non_finished_requests():
                self._pipeline.step()
            produced = {}
            for sequence, running in self._running.items():
                new: list[int] = []
                if running.handle.can_read():
                    for output in running.handle.read().values():
                        new.extend(int(t) for t in output.generated_ids)
                status = running.handle.get_status().name
                if status == "IGNORED":
                    raise InferenceError(
                        f"sequence {sequence}: the pipeline's KV cache of {self.context} tokens "
                        "could not hold its prompt"
                    )
                finished = status in _DONE
                if new or finished:
                    produced[sequence] = gen.Produced(tuple(new), running.text.add(new), finished)
            return produced

    def free(self, sequence: int) -> None:
        with self._lock:
            running = self._running.pop(sequence, None)
            if running is not None and running.handle.get_status().name == "RUNNING":
                running.handle.cancel()  # its KV blocks go back at the pipeline's next step

    def kv_bytes(self) -> tuple[int, int]:
        with self._lock:
            metrics = self._pipeline.get_metrics()
            allocated = int(metrics.cache_size_in_bytes)
            return int(allocated * metrics.cache_usage / 100), allocated

    def log_likelihoods(self, tokens: Sequence[int]) -> np.ndarray:
        """The IR's logits for every position in one inference (compiled on first use,
        beside the pipeline: only the packager and the health check score texts)."""
        if self._source.is_file():
            return super().log_likelihoods(tokens)
        with self._lock:
            if self._scorer is None:
                core = ov.Core()
                compiled = core.compile_model(
                    str(self._source / MODEL_XML),
                    self.device,
                    {"INFERENCE_NUM_THREADS": self._threads} if self.device == "CPU" else {},
                )
                self._scorer = compiled.create_infer_request()
            request = self._scorer
            request.reset_state()
            count = len(tokens)
            ids = np.array([tokens], dtype=np.int64)
            inputs = {
                "input_ids": ids,
                "attention_mask": np.ones_like(ids),
                "position_ids": np.arange(count, dtype=np.int64)[None],
                "beam_idx": np.zeros(1, dtype=np.int32),
            }
            logits = request.infer(inputs)["logits"][0].astype(np.float64)
        rows = logits[:-1]
        peak = rows.max(axis=1, keepdims=True)
        log_sum = peak[:, 0] + np.log(np.exp(rows - peak).sum(axis=1))
        return rows[np.arange(count - 1), np.asarray(tokens[1:])] - log_sum

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for running in self._running.values():
                running.handle.cancel()
            self._running.clear()
            self._pipeline = None
            self._scorer = None


class OpenVinoGenAIRuntime(gen.GenerativeRuntime):
    name = NAME

    def version(self) -> str:
        return str(ovg.__version__)

    def devices(self) -> list[str]:
        """CPU first, then OpenVINO's GPUs (paged KV cache: continuous batching)."""
        found = ov.Core().available_devices
        return ["CPU", *(d for d in found if d.startswith("GPU"))]

    def load(self, request: gen.GenerativeLoadRequest) -> OpenVinoGenAISession:
        if request.context < 1 or request.sequences < 1 or request.batch_tokens < 1:
            raise RuntimeLoadError("context, sequences and batch_tokens must be at least 1")
        source = _model_dir(request.files)
        if request.device not in self.devices():
            raise RuntimeLoadError(
                f"OpenVINO {ov.__version__} has no device {request.device!r} for continuous "
                f"batching here (devices: {', '.join(self.devices())})"
            )
        self._fits(source, request)
        try:
            return OpenVinoGenAISession(request, source, request.device)
        except RuntimeError as exc:  # OpenVINO's errors are RuntimeError subclasses
            raise RuntimeLoadError(f"OpenVINO GenAI could not load {source.name}: {exc}") from exc

    @staticmethod
    def _fits(source: Path, request: gen.GenerativeLoadRequest) -> None:
        """Refuse what cannot fit before building the pipeline: its weights and compute
        buffers. Its paged KV cache is allocated on the first step and then held to
        ``[llm] cache_mib`` by the scheduler, which reads its size from ``kv_bytes``."""
        files = list(source.iterdir()) if source.is_dir() else [source]
        weights = sum(f.stat().st_size for f in files if f.suffix in (".bin", ".gguf"))
        need = weights + OVERHEAD_BYTES
        budget = request.options.get("memory_budget_bytes")
        where = "the configured budget"
        if budget is None:
            budget, where = _available_bytes(), "available memory"
        if budget and need > int(budget):
            raise RuntimeLoadError(
                f"{source.name} needs at least {need / MIB:.0f} MiB (weights {weights / MIB:.0f}"
                f" MiB + {OVERHEAD_BYTES // MIB} MiB compute, before its KV cache) but {where} "
                f"is {int(budget) / MIB:.0f} MiB"
            )


IR_FILES = (
    MODEL_XML,
    "openvino_model.bin",
    "openvino_tokenizer.xml",
    "openvino_tokenizer.bin",
    "openvino_detokenizer.xml",
    "openvino_detokenizer.bin",
)


def ir_from_gguf(gguf: Path, out: Path) -> list[Path]:
    """GenAI's own GGUF → IR conversion (what it does in memory each time it loads a GGUF,
    seconds a load), saved once into ``out``: the model's and the tokenizer's IR files."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out, prefix=".gguf-") as tmp:
        link = Path(tmp) / gguf.name
        link.symlink_to(gguf.resolve())
        try:  # GenAI writes the IR beside the file it read
            ovg.LLMPipeline(str(link), "CPU", enable_save_ov_model=True)
        except RuntimeError as exc:
            raise RuntimeLoadError(f"OpenVINO GenAI cannot convert {gguf.name}: {exc}") from exc
        missing = [name for name in IR_FILES if not (Path(tmp) / name).is_file()]
        if missing:
            raise RuntimeLoadError(f"OpenVINO GenAI wrote no {', '.join(missing)} for {gguf.name}")
        return [(Path(tmp) / name).replace(out / name) for name in IR_FILES]


def create() -> OpenVinoGenAIRuntime:
    return OpenVinoGenAIRuntime()
