"""The ``[text]`` table of a language model's package (task ``text-generation``/``embedding``).

A language model has no tensors for clients to fill: what the agent needs to serve it is what
the file says about itself (architecture, trained context, whether it carries a chat template,
its begin/end tokens), recorded by ``edgeagent package`` from the GGUF's metadata, plus its
variants on generative runtimes and the golden prompts its health check replays. The package
reader (models.package) dispatches on the task and refuses the tensor tables (``TENSOR_ONLY``)
in such a package, so a package is one kind or the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

MAX_STOP_STRINGS = 16
# Tables of a tensor package that mean nothing for a language model.
TENSOR_ONLY = ("inputs", "outputs", "preprocess", "postprocess", "labels", "detection", "serving")


class Fields(Protocol):
    """The package reader's typed view of one TOML table (errors name file and field)."""

    def get(self, key: str, kind: Any, default: Any = ..., *, choices: Any = None) -> Any: ...

    def fail(self, problem: str, key: str | None = None) -> Any: ...  # raises

    def unknown(self, allowed: set[str]) -> None: ...


@dataclass(frozen=True)
class TextSpec:
    """The ``[text]`` table: what the model file says about itself, checked at packaging."""

    architecture: str
    context: int  # the trained context, tokens
    chat_template: bool  # the file carries a chat template (rendered from the file itself)
    bos: str
    eos: str
    stop: tuple[str, ...] = ()  # extra stop strings besides the model's end tokens


def parse_text(fields: Fields) -> TextSpec:
    """``[text]`` checked field by field."""
    fields.unknown({"architecture", "context", "chat_template", "bos", "eos", "stop"})
    context = fields.get("context", int)
    if not 1 <= context <= 1 << 24:
        fields.fail(f"{context} is not a context length in tokens (1..16777216)", "context")
    stop = fields.get("stop", list, [])
    if len(stop) > MAX_STOP_STRINGS or not all(isinstance(s, str) and s for s in stop):
        fields.fail(f"must be a list of at most {MAX_STOP_STRINGS} non-empty strings", "stop")
    architecture = fields.get("architecture", str)
    if not architecture.strip():
        fields.fail("must name the model's architecture (llama, gemma3 …)", "architecture")
    return TextSpec(
        architecture=architecture,
        context=context,
        chat_template=fields.get("chat_template", bool, False),
        bos=fields.get("bos", str, ""),
        eos=fields.get("eos", str, ""),
        stop=tuple(stop),
    )
