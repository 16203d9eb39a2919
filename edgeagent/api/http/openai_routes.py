"""OpenAI's API over the language plane: chat, completions, models, embeddings.

The stock ``openai`` client (and whatever is built on it: Home Assistant's OpenAI-compatible
integrations, Frigate's ``openai`` provider, LangChain) talks to the agent with only its
``base_url`` and API key (the agent's token) changed. The routes translate JSON to the engine's
types (``openai_requests``) and chunks back; streaming is SSE (``data: {...}`` … ``data:
[DONE]``), one event per chunk as it is produced. Every refusal on these paths — the agent's
token check and unknown routes included — is in OpenAI's error shape (``openai_errors``), so
the client raises its own typed errors with the agent's message.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
from aiohttp import web

from edgeagent.api.http.app_keys import LANGUAGE
from edgeagent.api.http.openai_requests import (
    OpenAIRequest,
    chat_request,
    completion_request,
    embedding_request,
    error_body,
)
from edgeagent.api.http.text_fields import FieldError, read_json_body
from edgeagent.api.http.text_stream import SSE_DONE, SSE_TYPE, answer, sse_event
from edgeagent.engine.errors import InvalidInput, ModelNotFound, ServingError
from edgeagent.engine.text_requests import Generation, LanguageModelInfo, Usage

OWNER = "edgeagent"


def usage_json(usage: Usage | None) -> dict[str, int]:
    prompt = usage.prompt_tokens if usage else 0
    completion = usage.completion_tokens if usage else 0
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


class Answer:
    """OpenAI's JSON of one answer, whole or as SSE chunks (chat or text completion)."""

    content_type = SSE_TYPE

    def __init__(self, parsed: OpenAIRequest, chat: bool) -> None:
        self.chat = chat
        self.model = parsed.generation.model
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.include_usage = parsed.include_usage

    def _frame(self, choices: list[dict[str, Any]], chunk: bool) -> dict[str, Any]:
        kind = "chat.completion" if self.chat else "text_completion"
        return {
            "id": self.id,
            "object": f"{kind}.chunk" if chunk and self.chat else kind,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": None,
            "choices": choices,
        }

    def whole(self, text: str, generation: Generation) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": generation.finish_reason}
        if self.chat:
            choice |= {"message": {"role": "assistant", "content": text}, "logprobs": None}
        else:
            choice |= {"text": text, "logprobs": None}
        return {**self._frame([choice], False), "usage": usage_json(generation.usage)}

    def chunk(
        self, text: str | None, finish_reason: str | None = None, first: bool = False
    ) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish_reason, "logprobs": None}
        if self.chat:
            delta = {"role": "assistant", "content": ""} if first else {}
            choice["delta"] = delta | ({"content": text} if text is not None else {})
        else:
            choice["text"] = text or ""
        frame = self._frame([choice], True)
        return frame | {"usage": None} if self.include_usage else frame

    def opening(self) -> bytes:
        """A chat stream starts with the assistant's role, as OpenAI's does."""
        return sse_event(self.chunk(None, first=True)) if self.chat else b""

    def text(self, text: str) -> bytes:
        return sse_event(self.chunk(text))

    def closing(self, generation: Generation) -> bytes:
        """The finish reason, the usage when asked (``choices`` empty), then ``[DONE]``."""
        last = sse_event(self.chunk(None, generation.finish_reason))
        if self.include_usage:
            usage = self._frame([], True) | {"usage": usage_json(generation.usage)}
            last += sse_event(usage)
        return last + SSE_DONE

    def error(self, exc: ServingError) -> bytes:
        """An ``error`` event: the openai client raises it as an ``APIError``."""
        return sse_event(error_body(exc.status, exc.message))


async def _answer(request: web.Request, parsed: OpenAIRequest, chat: bool) -> web.StreamResponse:
    generation = await request.app[LANGUAGE].generate(parsed.generation)
    return await answer(request, generation, parsed.stream, Answer(parsed, chat))


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _answer(request, chat_request(await read_json_body(request)), chat=True)


async def completions(request: web.Request) -> web.StreamResponse:
    return await _answer(request, completion_request(await read_json_body(request)), chat=False)


def model_json(info: LanguageModelInfo) -> dict[str, Any]:
    return {"id": info.name, "object": "model", "created": int(info.modified), "owned_by": OWNER}


async def list_models(request: web.Request) -> web.Response:
    models = request.app[LANGUAGE].models()
    return web.json_response({"object": "list", "data": [model_json(m) for m in models]})


async def retrieve_model(request: web.Request) -> web.Response:
    return web.json_response(model_json(request.app[LANGUAGE].info(request.match_info["model"])))


async def embeddings(request: web.Request) -> web.Response:
    parsed = embedding_request(await read_json_body(request))
    plane = request.app[LANGUAGE]
    info = plane.info(parsed.model)
    if info.task != "embedding":
        raise FieldError(
            "model",
            f"model {info.name!r} is a {info.task} model, not an embedding model: "
            "load an embedding package to use /v1/embeddings",
        )
    result = await plane.embed(parsed.model, parsed.inputs)
    data = []
    for index, vector in enumerate(result.vectors):
        value: Any = list(vector)
        if parsed.base64:
            value = base64.b64encode(np.asarray(vector, "<f4").tobytes()).decode("ascii")
        data.append({"object": "embedding", "index": index, "embedding": value})
    usage = {"prompt_tokens": result.prompt_tokens, "total_tokens": result.prompt_tokens}
    return web.json_response(
        {"object": "list", "data": data, "model": parsed.model, "usage": usage}
    )


def openai_routes() -> list[web.RouteDef]:
    return [
        web.post("/v1/chat/completions", chat_completions),
        web.post("/v1/completions", completions),
        web.get("/v1/models", list_models),
        web.get("/v1/models/{model}", retrieve_model),
        web.post("/v1/embeddings", embeddings),
    ]


# ---------------------------------------------------------------------------------------------
# Every answer on OpenAI's paths in OpenAI's error shape

OPENAI_PATHS = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models"}
)


def is_openai_path(path: str) -> bool:
    """OpenAI's paths, ``/v1/models/{id}`` included (``/v1/models/{name}/classify`` is the
    agent's own route and keeps the agent's shape)."""
    return path in OPENAI_PATHS or (path.startswith("/v1/models/") and path.count("/") == 3)


def openai_error(status: int, message: str, **fields: Any) -> web.Response:
    return web.json_response(error_body(status, message, **fields), status=status)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def openai_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refusals on OpenAI's paths in OpenAI's shape: the engine's errors (with the field in
    ``param``), the body limits, unknown methods, and the token check's answers, which come
    back from the auth middleware as the agent's ``{"error": "..."}`` and are re-shaped here."""
    if not is_openai_path(request.path):
        return await handler(request)
    try:
        response = await handler(request)
    except FieldError as exc:
        return openai_error(exc.status, exc.message, param=exc.param)
    except ModelNotFound as exc:
        return openai_error(exc.status, exc.message, param="model", code="model_not_found")
    except InvalidInput as exc:
        return openai_error(exc.status, exc.message)
    except ServingError as exc:
        if exc.status == 408:  # a body too slow: errors_middleware also closes the connection
            raise
        answer = openai_error(exc.status, exc.message)
        if exc.retry_after is not None:
            answer.headers["Retry-After"] = str(exc.retry_after)
        return answer
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        answer = openai_error(exc.status, f"{exc.reason}: {request.method} {request.path}")
        if "Allow" in exc.headers:
            answer.headers["Allow"] = exc.headers["Allow"]
        return answer
    return await _reshaped(response)


async def _reshaped(response: web.StreamResponse) -> web.StreamResponse:
    """A refusal the guard or the auth check answered in the agent's shape, in OpenAI's."""
    if response.status < 400 or not isinstance(response, web.Response) or response.prepared:
        return response
    try:
        message = json.loads(response.body)["error"]  # type: ignore[arg-type]
    except (TypeError, ValueError, KeyError):
        return response
    if not isinstance(message, str):
        return response
    answer = openai_error(response.status, message)
    for header in ("WWW-Authenticate", "Retry-After", "Allow"):
        if header in response.headers:
            answer.headers[header] = response.headers[header]
    return answer
