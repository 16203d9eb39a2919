"""Ollama's request bodies → the engine's ``GenerationRequest``.

Ollama's clients (its Python library, Home Assistant's Ollama integration, Frigate's GenAI
provider) send ``options`` with whatever their authors tuned for Ollama's llama.cpp —
``repeat_penalty``, ``num_ctx``, ``mirostat`` … Like Ollama itself, an option the agent does not
apply is accepted and has no effect (docs/api/ollama.md lists what is applied); an applied one
with a wrong type is a 400 naming it. What changes the answer's kind — images, tools, a JSON
``format``, thinking, a ``context`` to continue, a ``suffix`` — is refused with a 400, in the
words Ollama uses for a model that lacks the capability.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edgeagent.api.http.text_fields import (
    FieldError,
    optional_bool,
    optional_int,
    optional_number,
    optional_object,
    optional_string,
    refuse_if_set,
    roled_messages,
    stop_strings,
    string,
)
from edgeagent.engine.text_requests import ChatMessage, GenerationRequest, Sampling

LATEST = ":latest"


def model_name(body: dict[str, Any]) -> str:
    """``model`` (or the older ``name``), without Ollama's default tag ``:latest``."""
    key = "model" if body.get("model") is not None else "name"
    return string(body, key, param="model").removesuffix(LATEST)


@dataclass(frozen=True)
class OllamaRequest:
    model: str
    generation: GenerationRequest | None  # None: an empty prompt, Ollama's way to load a model
    stream: bool


def sampling(options: dict[str, Any]) -> Sampling:
    """The applied ``options``: num_predict, temperature, top_p, top_k, seed, stop."""
    limit = optional_int(options, "num_predict", -2, param="options.num_predict")
    temperature = optional_number(options, "temperature", 0.0, 2.0, param="options.temperature")
    top_p = optional_number(options, "top_p", 0.0, 1.0, param="options.top_p")
    return Sampling(
        # -1 (no limit) and -2 (fill the context) mean the agent's default, [llm] default_max_tokens
        max_tokens=limit if limit is not None and limit > 0 else None,
        temperature=1.0 if temperature is None else temperature,
        top_p=1.0 if top_p is None else top_p,
        top_k=optional_int(options, "top_k", 0, param="options.top_k") or 0,
        seed=optional_int(options, "seed", -(2**63), 2**63 - 1, param="options.seed"),
        stop=stop_strings(options.get("stop"), "options.stop"),
    )


def _refuse_capabilities(body: dict[str, Any], model: str) -> None:
    """What Ollama refuses for a model without the capability, refused the same way."""
    refuse_if_set(body, "images", f"{model!r} does not support images")
    refuse_if_set(body, "tools", f"{model!r} does not support tools")
    refuse_if_set(body, "think", f"{model!r} does not support thinking")
    refuse_if_set(
        body, "format", "structured output (a JSON format or schema) is not served; ask in words"
    )


def _common(body: dict[str, Any]) -> tuple[str, bool, Sampling]:
    model = model_name(body)
    _refuse_capabilities(body, model)
    stream = optional_bool(body, "stream", True)  # Ollama streams unless told not to
    options = optional_object(body, "options")
    return model, stream, sampling(options)


def chat_messages(value: Any, model: str) -> tuple[ChatMessage, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise FieldError("messages", "'messages' must be an array of messages")
    messages = []
    for where, role, item in roled_messages(value):
        refuse_if_set(item, "images", f"{model!r} does not support images", param=f"{where}.images")
        content = optional_string(item, "content", param=f"{where}.content") or ""
        messages.append(ChatMessage(role, content))
    return tuple(messages)


def chat_request(body: dict[str, Any]) -> OllamaRequest:
    """``POST /api/chat``; no messages loads the model and answers at once (``done_reason``
    "load"), as Ollama does."""
    model, stream, options = _common(body)
    messages = chat_messages(body.get("messages"), model)
    if not messages:
        return OllamaRequest(model, None, stream)
    request = GenerationRequest(model=model, messages=messages, sampling=options)
    return OllamaRequest(model, request, stream)


def generate_request(body: dict[str, Any]) -> OllamaRequest:
    """``POST /api/generate``: the prompt as the user's turn of the model's chat template (with
    ``system`` before it), or as raw text with ``raw``: true."""
    model, stream, options = _common(body)
    refuse_if_set(body, "suffix", f"{model!r} does not support insert (fill in the middle)")
    refuse_if_set(body, "context", "continuing from a context is not served; use /api/chat")
    refuse_if_set(body, "template", "the model's own chat template is used; send raw: true")
    prompt = optional_string(body, "prompt") or ""
    system = optional_string(body, "system")
    if not prompt:
        return OllamaRequest(model, None, stream)
    if optional_bool(body, "raw", False):
        request = GenerationRequest(model=model, prompt=prompt, sampling=options)
        return OllamaRequest(model, request, stream)
    turns = ([ChatMessage("system", system)] if system else []) + [ChatMessage("user", prompt)]
    request = GenerationRequest(model=model, messages=tuple(turns), sampling=options)
    return OllamaRequest(model, request, stream)


def embed_inputs(body: dict[str, Any], key: str) -> tuple[str, ...]:
    """``input`` of /api/embed (a string or an array of strings), ``prompt`` of the older
    /api/embeddings (a string)."""
    value = body.get(key)
    inputs = [value] if isinstance(value, str) else value
    if not isinstance(inputs, list) or not inputs or not all(isinstance(i, str) for i in inputs):
        raise FieldError(key, f"'{key}' must be a string or a non-empty array of strings")
    refuse_if_set(body, "dimensions", "vectors have the model's own size")
    return tuple(inputs)
