"""OpenAI's request bodies → the engine's ``GenerationRequest``, and errors in OpenAI's shape.

What is served is what OpenAI's chat and completions endpoints mean by the fields a local model
can honour: messages, ``max_tokens``/``max_completion_tokens``, ``temperature``, ``top_p``,
``seed``, ``stop``, ``n`` = 1, streaming with ``stream_options.include_usage`` (and llama.cpp's
``top_k``). A field asking for something the agent cannot do (tools, images, logprobs, JSON
mode, several choices) is refused with a 400 naming it, never ignored: the client would get an
answer to a different question. Fields that only tune billing or routing (``user``,
``metadata``, ``store``, ``service_tier``) and the penalties are accepted and have no effect
(docs/api/openai.md lists them).
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
    refuse_if_set,
    roled_messages,
    stop_strings,
    string,
)
from edgeagent.engine.text_requests import ChatMessage, GenerationRequest, Sampling

# OpenAI's newer name for the system role (its o-series models): the same instruction here.
ROLE_ALIASES = {"developer": "system"}


@dataclass(frozen=True)
class OpenAIRequest:
    generation: GenerationRequest
    stream: bool
    include_usage: bool  # stream_options.include_usage: a last chunk with the usage


def _content(value: Any, where: str) -> str:
    """A message's content: a string, null (an assistant turn that only called tools), or
    an array of text parts; an image part is refused (no model here reads images)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise FieldError(where, f"'{where}' must be a string or an array of content parts")
    texts = []
    for index, part in enumerate(value):
        here = f"{where}[{index}]"
        if not isinstance(part, dict):
            raise FieldError(here, f"'{here}' must be an object with a 'type'")
        if part.get("type") != "text":
            raise FieldError(
                here,
                f"'{here}' is a {part.get('type')!r} part: only text parts are supported "
                "(the served models do not read images or audio)",
            )
        texts.append(string(part, "text", param=f"{here}.text"))
    return "".join(texts)


def chat_messages(value: Any) -> tuple[ChatMessage, ...]:
    """``messages``: a non-empty array of {role, content}; an unknown role names itself."""
    if not isinstance(value, list) or not value:
        raise FieldError("messages", "'messages' must be a non-empty array of messages")
    return tuple(
        ChatMessage(role, _content(item.get("content"), f"{where}.content"))
        for where, role, item in roled_messages(value, ROLE_ALIASES)
    )


def sampling(body: dict[str, Any]) -> Sampling:
    """The sampling fields both endpoints share."""
    if optional_int(body, "n", 1) not in (None, 1):
        raise FieldError("n", "'n' must be 1: one choice per request is served")
    if optional_int(body, "best_of", 1) not in (None, 1):
        raise FieldError("best_of", "'best_of' must be 1: one choice per request is served")
    max_tokens = optional_int(body, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = optional_int(body, "max_tokens", 1)
    for penalty in ("frequency_penalty", "presence_penalty"):
        optional_number(body, penalty, -2.0, 2.0)  # checked, not applied (module docstring)
    temperature = optional_number(body, "temperature", 0.0, 2.0)
    top_p = optional_number(body, "top_p", 0.0, 1.0)
    return Sampling(
        max_tokens=max_tokens,
        temperature=1.0 if temperature is None else temperature,
        top_p=1.0 if top_p is None else top_p,
        top_k=optional_int(body, "top_k", 0) or 0,
        seed=optional_int(body, "seed", -(2**63), 2**63 - 1),
        stop=stop_strings(body.get("stop"), "stop"),
    )


def _streaming(body: dict[str, Any]) -> tuple[bool, bool]:
    stream = optional_bool(body, "stream", False)
    options = optional_object(body, "stream_options")
    if options and not stream:
        raise FieldError("stream_options", "'stream_options' is only allowed when 'stream' is true")
    return stream, optional_bool(
        options, "include_usage", False, param="stream_options.include_usage"
    )


def _refuse_unsupported(body: dict[str, Any]) -> None:
    refuse_if_set(body, "logprobs", "token log-probabilities are not reported")
    refuse_if_set(body, "top_logprobs", "token log-probabilities are not reported")
    refuse_if_set(body, "logit_bias", "the sampler takes no per-token bias")


def chat_request(body: dict[str, Any]) -> OpenAIRequest:
    """``POST /v1/chat/completions``."""
    model = string(body, "model")
    messages = chat_messages(body.get("messages"))
    _refuse_unsupported(body)
    for key in ("tools", "functions"):
        refuse_if_set(body, key, "the served models do not call tools")
    if body.get("tool_choice") not in (None, "none", "auto"):
        raise FieldError("tool_choice", "'tool_choice' is not supported: no tools are served")
    response_format = optional_object(body, "response_format")
    if response_format.get("type", "text") != "text":
        raise FieldError(
            "response_format",
            f"'response_format' {response_format.get('type')!r} is not supported: "
            "only text answers (no constrained JSON output)",
        )
    refuse_if_set(body, "audio", "the served models answer in text")
    if body.get("modalities") not in (None, ["text"]):
        raise FieldError("modalities", "'modalities' must be [\"text\"]")
    stream, include_usage = _streaming(body)
    request = GenerationRequest(model=model, messages=messages, sampling=sampling(body))
    return OpenAIRequest(request, stream, include_usage)


def completion_request(body: dict[str, Any]) -> OpenAIRequest:
    """``POST /v1/completions``: the prompt as raw text (no chat template)."""
    model = string(body, "model")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise FieldError(
            "prompt", "'prompt' must be a string (one prompt; token arrays are not accepted)"
        )
    _refuse_unsupported(body)
    refuse_if_set(body, "echo", "the prompt is not repeated in the answer")
    refuse_if_set(body, "suffix", "the served models do not fill in the middle")
    stream, include_usage = _streaming(body)
    request = GenerationRequest(model=model, prompt=prompt, sampling=sampling(body))
    return OpenAIRequest(request, stream, include_usage)


@dataclass(frozen=True)
class EmbeddingRequest:
    model: str
    inputs: tuple[str, ...]
    base64: bool  # encoding_format "base64": little-endian float32, as OpenAI sends it


def embedding_request(body: dict[str, Any]) -> EmbeddingRequest:
    """``POST /v1/embeddings``: text inputs (a string or an array of strings)."""
    model = string(body, "model")
    value = body.get("input")
    inputs = [value] if isinstance(value, str) else value
    if not isinstance(inputs, list) or not inputs or not all(isinstance(i, str) for i in inputs):
        raise FieldError(
            "input", "'input' must be a string or a non-empty array of strings (not tokens)"
        )
    encoding = body.get("encoding_format") or "float"
    if encoding not in ("float", "base64"):
        raise FieldError("encoding_format", "'encoding_format' must be 'float' or 'base64'")
    refuse_if_set(body, "dimensions", "vectors have the model's own size")
    return EmbeddingRequest(model, tuple(inputs), encoding == "base64")


# ---------------------------------------------------------------------------------------------
# Errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}}

_TYPES = {
    401: ("authentication_error", "invalid_api_key"),
    403: ("permission_error", None),
    404: ("invalid_request_error", None),
    429: ("rate_limit_error", "rate_limit_exceeded"),
    503: ("server_error", "service_unavailable"),
    504: ("server_error", "timeout"),
}


def error_body(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """The body OpenAI's clients parse (``openai.APIStatusError.code``/``param``/``type``)."""
    kind, default_code = _TYPES.get(
        status, ("invalid_request_error" if status < 500 else "server_error", None)
    )
    return {
        "error": {"message": message, "type": kind, "param": param, "code": code or default_code}
    }
