"""The stock ``openai`` and ``ollama`` clients, unchanged, against the agent serving SmolLM2 over
loopback TCP with its token: chat and completions, streamed and not, sync and async, the model
lists, and their own typed errors for what the agent refuses."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import httpx
import ollama
import openai
import pytest

from devtools.agent_process import TOKEN
from tests.support.helpers import REPO
from tests.support.language_agent import (
    MODEL,
    LanguageAgent,
    language_agent,
    whole_and_streamed,
)

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LanguageAgent]:
    with language_agent(tmp_path_factory.mktemp("llm")) as running:
        yield running


def _openai(agent: LanguageAgent) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{agent.url}/v1", api_key=TOKEN, max_retries=0)


def _ollama(agent: LanguageAgent) -> ollama.Client:
    return ollama.Client(host=agent.url, headers={"Authorization": f"Bearer {TOKEN}"})


def test_openai_chat_whole_and_streamed_give_the_same_greedy_text(agent: LanguageAgent) -> None:
    client = _openai(agent)
    whole, chunks = whole_and_streamed(client, messages=QUESTION, max_tokens=8, temperature=0)
    text = whole.choices[0].message.content
    assert text and whole.choices[0].finish_reason in ("stop", "length")
    assert whole.usage is not None and 0 < whole.usage.completion_tokens <= 8
    assert whole.usage.prompt_tokens > 5  # the question in the chat template
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 1  # chunked
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == (
        whole.usage.completion_tokens
    )


async def test_the_async_openai_client_streams_and_completes_raw_prompts(
    agent: LanguageAgent,
) -> None:
    client = openai.AsyncOpenAI(base_url=f"{agent.url}/v1", api_key=TOKEN, max_retries=0)
    stream = await client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=6, temperature=0, stream=True
    )
    parts = [c.choices[0].delta.content async for c in stream if c.choices]
    assert "".join(p or "" for p in parts)
    completion = await client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=6, temperature=0, seed=1
    )
    assert completion.object == "text_completion" and completion.choices[0].text
    again = await client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=6, temperature=0, seed=1
    )
    assert again.choices[0].text == completion.choices[0].text
    await client.close()


def test_openai_models_and_its_typed_errors(agent: LanguageAgent) -> None:
    client = _openai(agent)
    assert [m.id for m in client.models.list()] == [MODEL]
    assert client.models.retrieve(MODEL).owned_by == "edgeagent"
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="gpt-4o", messages=QUESTION)
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as several:
        client.chat.completions.create(model=MODEL, messages=QUESTION, n=2)
    assert several.value.param == "n"
    with pytest.raises(openai.BadRequestError, match="not an embedding model"):
        client.embeddings.create(model=MODEL, input="hello")
    wrong = openai.OpenAI(base_url=f"{agent.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as refused:
        wrong.models.list()
    assert refused.value.code == "invalid_api_key"


def test_ollama_chat_and_generate_streamed_and_not(agent: LanguageAgent) -> None:
    client = _ollama(agent)
    options = {"num_predict": 8, "temperature": 0}
    whole = client.chat(model=MODEL, messages=QUESTION, stream=False, options=options)
    assert whole.done and whole.done_reason in ("stop", "length")
    assert whole.message.content and 0 < (whole.eval_count or 0) <= 8
    assert (whole.prompt_eval_count or 0) > 5 and (whole.total_duration or 0) > 0
    parts = list(
        client.chat(model=f"{MODEL}:latest", messages=QUESTION, options=options, stream=True)
    )
    assert parts[-1].done and not any(p.done for p in parts[:-1])
    assert "".join(p.message.content or "" for p in parts) == whole.message.content
    generated = client.generate(
        model=MODEL, prompt="What is the capital of France?", options=options
    )
    assert generated.response == whole.message.content  # the prompt as the user's turn
    streamed = list(client.generate(model=MODEL, prompt="Hi", options=options, stream=True))
    assert streamed[-1].done and "".join(p.response for p in streamed)


def test_ollama_list_show_ps_version_and_errors(agent: LanguageAgent) -> None:
    client = _ollama(agent)
    listed = client.list().models
    assert [m.model for m in listed] == [f"{MODEL}:latest"]
    assert listed[0].details is not None and listed[0].details.family == "llama"
    assert (listed[0].size or 0) > 50_000_000
    shown = client.show(MODEL)
    assert shown.capabilities == ["completion"] and "im_start" in (shown.template or "")
    assert shown.modelinfo and shown.modelinfo["llama.context_length"] == 512
    assert [m.model for m in client.ps().models] == [f"{MODEL}:latest"]
    with pytest.raises(ollama.ResponseError) as missing:
        client.chat(model="llama3", messages=QUESTION)
    assert missing.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as images:
        client.generate(model=MODEL, prompt="What is this?", images=[b"\x89PNG\r\n"])
    assert images.value.status_code == 400 and "images" in images.value.error
    with pytest.raises(ollama.ResponseError) as embedding:
        client.embed(model=MODEL, input="hello")
    assert embedding.value.status_code == 400


def test_no_token_no_answer(agent: LanguageAgent) -> None:
    with pytest.raises(ollama.ResponseError) as refused:
        ollama.Client(host=agent.url).list()
    assert refused.value.status_code == 401


def test_status_shows_the_batch_kv_cache_and_tokens_per_second(agent: LanguageAgent) -> None:
    _openai(agent).completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8)
    model = agent.model_status()
    assert model["state"] == "READY" and model["running"] == 0 and model["waiting"] == 0
    assert model["kv_bytes_allocated"] > 0
    shown = subprocess.run(
        [sys.executable, "-m", "edgeagent.cli", "status", "--socket", str(agent.socket)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200"},
    )
    assert shown.returncode == 0, shown.stderr
    line = next(line for line in shown.stdout.splitlines() if line.startswith("language"))
    assert f"{MODEL} 1.0.0 llama_cpp/CPU: 0/" in line and "0 waiting; KV " in line
    assert line.endswith("tokens/s median")


def test_the_agents_own_model_routes_keep_the_agents_shape(agent: LanguageAgent) -> None:
    """``/v1/models/{name}/classify`` is the agent's own route and keeps the agent's shape."""
    import requests

    response = requests.post(
        f"{agent.url}/v1/models/{MODEL}/classify", headers=agent.headers, data=b"x", timeout=30
    )
    assert response.status_code == 404 and isinstance(response.json()["error"], str)


def test_the_unix_socket_serves_the_same_apis_without_a_token(agent: LanguageAgent) -> None:
    """The socket's file mode is its access control (no token), as for every other API."""
    transport = httpx.HTTPTransport(uds=str(agent.socket))
    client = openai.OpenAI(
        base_url="http://agent/v1",
        api_key="unused",
        http_client=httpx.Client(transport=transport),
        max_retries=0,
    )
    answer = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=4)
    assert answer.choices[0].message.content
    local = ollama.Client(host="http://agent", transport=httpx.HTTPTransport(uds=str(agent.socket)))
    assert [m.model for m in local.list().models] == [f"{MODEL}:latest"]
