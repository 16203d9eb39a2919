"""One table of what the agent knows about each runtime, so no list is spelled twice.

Package validation (which file suffixes a variant may carry), the plugin loader (which module),
version discovery (which distributions, read from metadata without importing tens of MB of
native code), and the v2 metadata (Triton's platform name, so tools recognise the backend) all
read this table.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RuntimeFacts:
    name: str  # the name used in model.toml, profiles and the API
    module: str  # the plugin module, imported only when the runtime is used
    distributions: tuple[str, ...]  # Python distributions that provide it, preferred first
    suffixes: tuple[str, ...]  # model file suffixes a variant of this runtime may carry
    platform: str  # Triton's platform name in v2 model metadata


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
            (".xml", ".bin", ".onnx"),
            "openvino",
        ),
    )
}
RUNTIME_NAMES: tuple[str, ...] = tuple(RUNTIME_FACTS)


def v2_platform(runtime: str) -> str:
    """Triton's platform name for ``runtime`` ("unknown" for a runtime not in the table)."""
    facts = RUNTIME_FACTS.get(runtime)
    return facts.platform if facts else "unknown"
