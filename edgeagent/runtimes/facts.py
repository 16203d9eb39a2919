"""One table of what the agent knows about each runtime, so no list is spelled twice.

Package validation (which file suffixes a variant may carry), the packager (which runtime's
format a file is, which weights file it needs beside it), each plugin (which file of a variant
it opens), the plugin loader (which module), version discovery (which distributions, read from
metadata without importing tens of MB of native code), and the v2 metadata (Triton's platform
name, so tools recognise the backend) all read this table.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RuntimeFacts:
    name: str  # the name used in model.toml, profiles and the API
    module: str  # the plugin module, imported only when the runtime is used
    distributions: tuple[str, ...]  # Python distributions that provide it, preferred first
    model_suffixes: tuple[str, ...]  # model files it opens: its own format first
    platform: str  # Triton's platform name in v2 model metadata
    weights: str | None = None  # the file its own format keeps the weights in, beside the model

    @property
    def suffixes(self) -> tuple[str, ...]:
        """Every file suffix a variant of this runtime may carry."""
        return self.model_suffixes + ((self.weights,) if self.weights else ())

    @property
    def native_suffix(self) -> str:
        """The suffix of the runtime's own format (what identifies a file as this runtime's)."""
        return self.model_suffixes[0]


RUNTIME_FACTS: dict[str, RuntimeFacts] = {
    facts.name: facts
    for facts in (
        RuntimeFacts(
            "onnxruntime",
            "edgeagent.runtimes.onnx",
            ("onnxruntime", "onnxruntime-gpu", "onnxruntime-openvino"),
            (".onnx",),
            "onnxruntime_onnx",
        ),
        RuntimeFacts(
            "litert",
            "edgeagent.runtimes.litert",
            ("ai-edge-litert", "tflite-runtime"),
            (".tflite",),
            "tflite",
        ),
        RuntimeFacts(
            "openvino",
            "edgeagent.runtimes.openvino",
            ("openvino",),
            (".xml", ".onnx"),  # OpenVINO reads ONNX too
            "openvino",
            weights=".bin",
        ),
        # A generative runtime (runtimes.generative): served by the language plane, never
        # by the tensor registry or the vision probe.
        RuntimeFacts(
            "llama_cpp",
            "edgeagent.runtimes.llama_cpp",
            ("llama-cpp-python",),
            (".gguf",),
            "llama_cpp",
        ),
        # OpenVINO GenAI's LLM pipelines: an IR folder (the model's and the tokenizer's .xml
        # with their .bin), or a GGUF it converts when loading.
        RuntimeFacts(
            "openvino_genai",
            "edgeagent.runtimes.openvino_genai",
            ("openvino-genai",),
            (".xml", ".gguf"),
            "openvino_genai",
            weights=".bin",
        ),
    )
}
# Runtimes that load language models (runtimes.generative) rather than tensor models.
GENERATIVE_RUNTIMES: tuple[str, ...] = ("llama_cpp", "openvino_genai")
RUNTIME_NAMES: tuple[str, ...] = tuple(RUNTIME_FACTS)
# Which runtime's own format each file suffix is (.onnx is onnxruntime's, though OpenVINO reads
# it): the first runtime in the table to name a suffix owns it (.xml is openvino's IR, which
# openvino_genai reads too).
NATIVE_SUFFIXES: dict[str, str] = {}
for _facts in RUNTIME_FACTS.values():
    NATIVE_SUFFIXES.setdefault(_facts.native_suffix, _facts.name)


def native_runtime(path: Path) -> str | None:
    """The runtime whose own format ``path`` is, by its suffix; None for any other file."""
    return NATIVE_SUFFIXES.get(path.suffix.lower())


def weights_file(path: Path) -> Path | None:
    """The weights file a model file of its runtime's own format needs beside it (an OpenVINO
    IR .xml: its .bin); None when the file holds its weights itself."""
    runtime = native_runtime(path)
    weights = RUNTIME_FACTS[runtime].weights if runtime else None
    return path.with_suffix(weights) if weights else None


def v2_platform(runtime: str) -> str:
    """Triton's platform name for ``runtime`` ("unknown" for a runtime not in the table)."""
    facts = RUNTIME_FACTS.get(runtime)
    return facts.platform if facts else "unknown"
