"""The aiohttp application keys every route module reads (one place, no import cycles)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from typing import Any, Protocol

from aiohttp import web
from prometheus_client import CollectorRegistry

from edgeagent.api.jsonparse.helper import JsonHelper
from edgeagent.api.settings import ServerSettings
from edgeagent.api.shm.regions import SharedMemoryRegistry
from edgeagent.engine.budget import Budget
from edgeagent.engine.dataplane import DataPlane
from edgeagent.engine.text_requests import (
    Embeddings,
    Generation,
    GenerationRequest,
    LanguageModelInfo,
)
from edgeagent.updates.locks import UpdateLocks


class LanguagePlane(Protocol):
    """What the OpenAI and Ollama routes ask of the engine's language plane
    (``edgeagent.engine.language.plane.LanguagePlane``): named by its calls here, so the routes
    depend on the contract of ``text_requests`` and not on the scheduler behind it."""

    def models(self) -> list[LanguageModelInfo]: ...

    def info(self, name: str) -> LanguageModelInfo: ...

    async def generate(self, request: GenerationRequest) -> Generation: ...

    async def embed(self, model: str, inputs: Sequence[str]) -> Embeddings: ...

    def status(self) -> dict[str, Any]: ...


DATAPLANE = web.AppKey("dataplane", DataPlane)
UPDATE_LOCKS = web.AppKey("update_locks", UpdateLocks)  # /v1/update-lock (updates.locks)
SETTINGS = web.AppKey("settings", ServerSettings)
METRICS = web.AppKey("metrics", CollectorRegistry)
STATUS: web.AppKey[Callable[[], dict[str, Any]]] = web.AppKey("status")
# One decoding budget per kind of listener, so TCP clients cannot starve the local socket.
BUDGETS: web.AppKey[dict[str, Budget]] = web.AppKey("budgets")
SHARED_MEMORY = web.AppKey("shared_memory", SharedMemoryRegistry)
# The one thread that decodes large JSON bodies off the event loop: those the JSON helper
# does not take, and heavy helper replies (see ``json_decoder``).
JSON_DECODER = web.AppKey("json_decoder", Executor)
# The helper process that parses large JSON bodies outside the daemon's GIL.
JSON_HELPER = web.AppKey("json_helper", JsonHelper)
# The language plane, when the daemon serves language models (absent: no OpenAI/Ollama routes).
LANGUAGE = web.AppKey("language", LanguagePlane)
