"""Frigate's own Ollama GenAI provider (``tests/fixtures/frigate``: its file verbatim, only the
Frigate modules it imports stood in for) against the agent serving SmolLM2, as Frigate runs it
with ``genai.provider: ollama``, ``base_url`` the agent and ``api_key`` its token."""

from __future__ import annotations

import asyncio
import hashlib
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from devtools.agent_process import TOKEN
from tests.support.helpers import REPO
from tests.support.language_agent import MODEL, LanguageAgent, language_agent

FIXTURE = REPO / "tests" / "fixtures" / "frigate"
VERBATIM = FIXTURE / "frigate" / "genai" / "plugins" / "ollama.py"
SHA256 = "c9fb96b05ffea84ab8c661e1accd0b16b71c9be2c265c69622ec78ddd360ef12"  # see README.md
SHORT = {"options": {"num_predict": 8, "temperature": 0}}  # Frigate's provider_options


@pytest.fixture(scope="module")
def frigate() -> Iterator[Any]:
    assert hashlib.sha256(VERBATIM.read_bytes()).hexdigest() == SHA256, "not Frigate's file"
    sys.path.insert(0, str(FIXTURE))
    try:
        from frigate.config import GenAIConfig, GenAIProviderEnum
        from frigate.genai import PROVIDERS
        from frigate.genai.plugins import ollama as plugin

        yield plugin, GenAIConfig, PROVIDERS[GenAIProviderEnum.ollama]
    finally:
        sys.path.remove(str(FIXTURE))
        for name in [m for m in sys.modules if m == "frigate" or m.startswith("frigate.")]:
            del sys.modules[name]


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LanguageAgent]:
    with language_agent(tmp_path_factory.mktemp("frigate")) as running:
        yield running


def _client(frigate: Any, agent: LanguageAgent, **config: Any) -> Any:
    _, GenAIConfig, OllamaClient = frigate
    fields = {"provider": "ollama", "model": MODEL, "base_url": agent.url, "api_key": TOKEN}
    return OllamaClient(GenAIConfig(**(fields | {"provider_options": SHORT} | config)))


def test_frigate_validates_the_model_and_lists_it(frigate: Any, agent: LanguageAgent) -> None:
    client = _client(frigate, agent)
    assert client.provider is not None  # show() answered: the model is there
    assert client.list_models() == [f"{MODEL}:latest"]
    assert client.supports_toggleable_thinking is False  # so it never sends "think"
    missing = _client(frigate, agent, model="llava")
    assert missing.provider is None  # Frigate logs "Error initializing Ollama"


def test_frigate_describes_from_a_text_prompt(frigate: Any, agent: LanguageAgent) -> None:
    text = _client(frigate, agent)._send("Describe a red car parked in a driveway.", [])
    assert isinstance(text, str) and text


def test_frigate_gets_a_clear_refusal_for_images_and_json_formats(
    frigate: Any, agent: LanguageAgent, caplog: pytest.LogCaptureFixture
) -> None:
    client = _client(frigate, agent)
    assert client._send("What is in this picture?", [b"\xff\xd8 a jpeg"]) is None
    assert "does not support images" in caplog.text
    schema = {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}
    assert client._send("Describe.", [], response_format=schema) is None
    assert "structured output" in caplog.text


def test_frigate_chats_streamed_and_not_with_its_stats(frigate: Any, agent: LanguageAgent) -> None:
    client = _client(frigate, agent)
    messages = [{"role": "user", "content": "Say hello."}]
    answer = client.chat_with_tools(messages)
    assert answer["content"] and answer["finish_reason"] == "stop"
    with_tools = client.chat_with_tools(messages, tools=[{"type": "function"}])
    assert with_tools["finish_reason"] == "error"  # refused: the model calls no tools

    async def stream() -> list[tuple[str, Any]]:
        return [event async for event in client.chat_with_tools_stream(messages)]

    events = asyncio.run(stream())
    kinds = [kind for kind, _ in events]
    assert "content_delta" in kinds and kinds[-1] == "message"
    stats = dict(events)["stats"]
    assert 0 < stats["completion_tokens"] <= 8 and stats["prompt_tokens"] > 0
    assert stats["tokens_per_second"] > 0
    assert events[-1][1]["content"] == "".join(v for k, v in events if k == "content_delta").strip()
