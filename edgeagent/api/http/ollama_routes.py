"""Ollama's API over the language plane: chat, generate, tags, show, ps, version, embed.

Home Assistant's Ollama integration and Frigate's GenAI provider call an Ollama server through
the ``ollama`` Python library; pointed at the agent (its URL, and the agent's token as an
``Authorization: Bearer`` header) they list, inspect and run its language models unchanged.
Answers stream as NDJSON unless ``stream`` is false (Ollama's default is to stream); the last
line carries ``done_reason`` and Ollama's counters (tokens, durations in nanoseconds). Errors
are Ollama's ``{"error": "..."}`` with the engine's status, which is also the agent's own shape,
so the app's error middleware answers them; an error after the stream began is a last
``{"error": ...}`` line, which the client raises.
"""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Any

from aiohttp import web

from edgeagent import __version__
from edgeagent.api.http.app_keys import LANGUAGE
from edgeagent.api.http.ollama_requests import (
    LATEST,
    OllamaRequest,
    chat_request,
    embed_inputs,
    generate_request,
    model_name,
)
from edgeagent.api.http.text_fields import FieldError, read_json_body
from edgeagent.api.http.text_stream import NDJSON_TYPE, answer, ndjson_line
from edgeagent.engine.errors import ServingError
from edgeagent.engine.text_requests import Generation, LanguageModelInfo

# The Ollama API level whose endpoints and fields these routes answer (what /api/version says:
# clients that gate features on it see the release these shapes follow).
OLLAMA_VERSION = "0.12.0"
NS = 1_000_000_000


def timestamp(seconds: float | None = None) -> str:
    """RFC 3339 in UTC, as Ollama writes ``created_at`` and ``modified_at``."""
    moment = datetime.fromtimestamp(time.time() if seconds is None else seconds, timezone.utc)
    return moment.isoformat().replace("+00:00", "Z")


def parameter_size(parameters: int) -> str:
    """Ollama's ``parameter_size``: 135M, 1.5B …"""
    for unit, scale in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if parameters >= scale:
            return f"{parameters / scale:.3g}{unit}"
    return str(parameters)


def details(info: LanguageModelInfo) -> dict[str, Any]:
    return {
        "parent_model": "",
        "format": "gguf" if info.runtime == "llama_cpp" else info.runtime,
        "family": info.architecture,
        "families": [info.architecture],
        "parameter_size": parameter_size(info.parameters),
        "quantization_level": info.quantization.upper(),
    }


def tag_json(info: LanguageModelInfo) -> dict[str, Any]:
    return {
        "name": info.name + LATEST,
        "model": info.name + LATEST,
        "modified_at": timestamp(info.modified),
        "size": info.size_bytes,
        "digest": info.digest,
        "details": details(info),
    }


def counters(generation: Generation) -> dict[str, Any]:
    """The last line's ``done_reason`` and counters (durations in nanoseconds)."""
    usage = generation.usage
    if usage is None:
        return {"done_reason": generation.finish_reason}
    return {
        "done_reason": generation.finish_reason,
        "total_duration": int(usage.total_s * NS),
        "load_duration": 0,
        "prompt_eval_count": usage.prompt_tokens,
        "prompt_eval_duration": int(usage.first_token_s * NS),
        "eval_count": usage.completion_tokens,
        "eval_duration": int(max(usage.total_s - usage.first_token_s, 0.0) * NS),
    }


class Lines:
    """Ollama's JSON of one answer, whole or as NDJSON lines: /api/chat puts the text in
    ``message``, /api/generate in ``response``; the last line has ``done`` and the counters."""

    content_type = NDJSON_TYPE

    def __init__(self, model: str, chat: bool) -> None:
        self.model = model
        self.chat = chat

    def line(self, text: str, done: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "created_at": timestamp()}
        if self.chat:
            body["message"] = {"role": "assistant", "content": text}
        else:
            body["response"] = text
        return body | {"done": done}

    def whole(self, text: str, generation: Generation) -> dict[str, Any]:
        return self.line(text, True) | counters(generation)

    def opening(self) -> bytes:
        return b""

    def text(self, text: str) -> bytes:
        return ndjson_line(self.line(text, False))

    def closing(self, generation: Generation) -> bytes:
        return ndjson_line(self.whole("", generation))

    def error(self, exc: ServingError) -> bytes:
        """An ``error`` line: the ollama client raises it as a ``ResponseError``."""
        return ndjson_line({"error": exc.message})


async def _answer(request: web.Request, parsed: OllamaRequest, chat: bool) -> web.StreamResponse:
    plane = request.app[LANGUAGE]
    if parsed.generation is None:  # load only: say the model is there (404 if it is not)
        info = plane.info(parsed.model)
        return web.json_response(Lines(info.name, chat).line("", True) | {"done_reason": "load"})
    generation = await plane.generate(parsed.generation)
    return await answer(request, generation, parsed.stream, Lines(parsed.generation.model, chat))


async def chat(request: web.Request) -> web.StreamResponse:
    return await _answer(request, chat_request(await read_json_body(request)), chat=True)


async def generate(request: web.Request) -> web.StreamResponse:
    return await _answer(request, generate_request(await read_json_body(request)), chat=False)


async def tags(request: web.Request) -> web.Response:
    models = request.app[LANGUAGE].models()
    return web.json_response({"models": [tag_json(m) for m in models]})


async def running(request: web.Request) -> web.Response:
    """``/api/ps``: every served model is loaded and stays so (no keep-alive expiry)."""
    models = []
    for info in request.app[LANGUAGE].models():
        on_cpu = info.device.upper().startswith("CPU")
        models.append(
            tag_json(info)
            | {
                "expires_at": "9999-12-31T23:59:59Z",
                "size_vram": 0 if on_cpu else info.size_bytes,
                "context_length": info.context,
            }
        )
    return web.json_response({"models": models})


async def show(request: web.Request) -> web.Response:
    info = request.app[LANGUAGE].info(model_name(await read_json_body(request)))
    capabilities = ["embedding"] if info.task == "embedding" else ["completion"]
    return web.json_response(
        {
            "license": "",
            "modelfile": f"# served by edgeagent: package {info.name} {info.version}\n",
            "parameters": "",
            "template": info.chat_template or "",
            "details": details(info),
            "model_info": {
                "general.architecture": info.architecture,
                "general.parameter_count": info.parameters,
                f"{info.architecture}.context_length": info.context,
            },
            "capabilities": capabilities,
            "modified_at": timestamp(info.modified),
        }
    )


async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": OLLAMA_VERSION, "edgeagent": __version__})


async def _embed(request: web.Request, key: str) -> tuple[str, Any, float]:
    body = await read_json_body(request)
    model = model_name(body)
    inputs = embed_inputs(body, key)
    plane = request.app[LANGUAGE]
    info = plane.info(model)
    if info.task != "embedding":
        raise FieldError("model", f"{model!r} does not support embeddings")
    started = time.perf_counter()
    result = await plane.embed(model, inputs)
    return model, result, time.perf_counter() - started


async def embed(request: web.Request) -> web.Response:
    model, result, took = await _embed(request, "input")
    return web.json_response(
        {
            "model": model,
            "embeddings": [list(vector) for vector in result.vectors],
            "total_duration": int(took * NS),
            "load_duration": 0,
            "prompt_eval_count": result.prompt_tokens,
        }
    )


async def embeddings(request: web.Request) -> web.Response:
    """The older single-prompt form (``prompt`` → ``embedding``)."""
    _, result, _ = await _embed(request, "prompt")
    return web.json_response({"embedding": list(result.vectors[0])})


def ollama_routes() -> list[web.RouteDef]:
    return [
        web.post("/api/chat", chat),
        web.post("/api/generate", generate),
        web.get("/api/tags", tags),
        web.get("/api/ps", running),
        web.post("/api/show", show),
        web.get("/api/version", version),
        web.post("/api/embed", embed),
        web.post("/api/embeddings", embeddings),
    ]
