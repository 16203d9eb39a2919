"""What a careless or hostile client sends the language APIs: broken JSON, unknown roles, a
prompt longer than the context, max_tokens above the cap, a flood of streams beyond the batch
and the queue, and a client that leaves mid-stream. Each gets a clear error in its API's shape
(or its generation closed), and the agent keeps serving."""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import ollama
import openai
import pytest
import requests

from devtools.agent_process import TOKEN
from devtools.waiting import until
from tests.support.language_agent import LIMITS, MODEL, LanguageAgent, language_agent

SEQUENCES, QUEUE = 4, 4
CAP = 448  # max_tokens: room for an answer still running when its client leaves
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Count to ten."}]}


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LanguageAgent]:
    with language_agent(
        tmp_path_factory.mktemp("hostile"),
        server="max_connections = 200",  # the flood meets the queue, not the connection cap
        sequences=SEQUENCES,
        queue=QUEUE,
        max_tokens=CAP,
    ) as running:
        yield running


def _post(agent: LanguageAgent, path: str, body: bytes | dict) -> requests.Response:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {**agent.headers, "Content-Type": "application/json"}
    return requests.post(agent.url + path, data=data, headers=headers, timeout=60)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/api/chat"])
def test_broken_json_is_a_400_in_each_apis_shape(agent: LanguageAgent, path: str) -> None:
    response = _post(agent, path, b'{"model": "smollm2", "messages": [')
    assert response.status_code == 400
    error = response.json()["error"]
    message = error["message"] if path.startswith("/v1") else error
    assert "not valid JSON" in message
    if path.startswith("/v1"):
        assert error["type"] == "invalid_request_error"


def test_an_unknown_role_names_the_message(agent: LanguageAgent) -> None:
    bad = {**CHAT, "messages": [{"role": "user", "content": "a"}, {"role": "god", "content": "b"}]}
    openai = _post(agent, "/v1/chat/completions", bad)
    assert openai.status_code == 400 and openai.json()["error"]["param"] == "messages[1].role"
    ollama = _post(agent, "/api/chat", bad)
    assert ollama.status_code == 400 and "messages[1].role" in ollama.json()["error"]


def test_a_prompt_longer_than_the_context_names_both_numbers(agent: LanguageAgent) -> None:
    long = {**CHAT, "messages": [{"role": "user", "content": "word " * 2000}]}
    for path in ("/v1/chat/completions", "/api/chat"):
        response = _post(agent, path, long)
        assert response.status_code == 400, response.text
        text = json.dumps(response.json())
        assert str(LIMITS["context"]) in text and "context" in text


def test_max_tokens_above_the_cap_is_refused_not_capped(agent: LanguageAgent) -> None:
    cap = CAP
    openai = _post(agent, "/v1/chat/completions", {**CHAT, "max_tokens": cap + 1})
    assert openai.status_code == 400 and str(cap) in openai.json()["error"]["message"]
    ollama = _post(agent, "/api/chat", {**CHAT, "options": {"num_predict": cap + 1}})
    assert ollama.status_code == 400 and str(cap) in ollama.json()["error"]
    assert _post(agent, "/v1/chat/completions", {**CHAT, "max_tokens": 4}).status_code == 200


async def _stream(session: aiohttp.ClientSession, agent: LanguageAgent) -> tuple[int, str, bytes]:
    body = {**CHAT, "max_tokens": 8, "stream": True}
    async with session.post(
        f"{agent.url}/v1/chat/completions", json=body, headers=agent.headers
    ) as response:
        return response.status, response.headers.get("Retry-After", ""), await response.read()


async def test_a_hundred_streams_against_the_batch_and_queue(agent: LanguageAgent) -> None:
    """Beyond the sequences running and the queue waiting, 429 with Retry-After at once; every
    admitted stream completes; the agent answers the next request as before."""
    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), timeout=aiohttp.ClientTimeout(total=300)
    ) as session:
        answers = await asyncio.gather(*(_stream(session, agent) for _ in range(100)))
    statuses = [status for status, _, _ in answers]
    assert set(statuses) <= {200, 429}, statuses
    assert statuses.count(429) > 0 and statuses.count(200) > 0
    for status, retry_after, body in answers:
        if status == 429:
            assert int(retry_after) >= 1
            assert json.loads(body)["error"]["type"] == "rate_limit_error"
        else:
            assert body.endswith(b"data: [DONE]\n\n")  # every admitted stream finished
    await until(lambda: agent.model_status()["running"] == 0, what="the batch drained")
    assert _post(agent, "/v1/chat/completions", {**CHAT, "max_tokens": 4}).status_code == 200


async def test_a_client_that_leaves_mid_stream_frees_its_sequence(agent: LanguageAgent) -> None:
    """The client reads the first tokens of a long answer (a raw story, which goes on) and
    closes the connection: the generation is cancelled, not run to its end, and its KV cache
    freed (what stays in use is the prefix cache of finished prompts)."""
    requests_ = {
        "/v1/completions": {"prompt": "Once upon a time", "max_tokens": CAP, "stream": True},
        "/api/generate": {
            "prompt": "Once upon a time",
            "raw": True,
            "options": {"num_predict": CAP},
        },
    }
    for path, fields in requests_.items():
        before = _cancelled(agent)
        async with aiohttp.ClientSession() as session:
            response = await session.post(
                agent.url + path, json={"model": MODEL, **fields}, headers=agent.headers
            )
            assert response.status == 200
            tokens = 0
            while tokens < 3:  # a few tokens came: the sequence is running
                tokens += b'"' in await response.content.readline()
            during = agent.model_status()
            assert during["running"] == 1
            response.close()  # drop the connection mid-answer
        await until(lambda b=before: _cancelled(agent) > b, what="the generation cancelled")
        await until(lambda: agent.model_status()["running"] == 0, what="the sequence freed")
        assert agent.model_status()["kv_bytes_used"] < during["kv_bytes_used"]
    assert agent.process.poll() is None


def _cancelled(agent: LanguageAgent) -> float:
    return agent.metric("edgeagent_llm_generations_total", model=MODEL, outcome="cancelled")


async def test_a_client_that_leaves_before_a_whole_answer_frees_its_sequence(
    agent: LanguageAgent,
) -> None:
    """Not streamed: the answer is collected for a client that may go; once it is gone the
    generation stops at its next token rather than running to max_tokens for no one."""
    before = _cancelled(agent)
    body = json.dumps({"model": MODEL, "prompt": "Once upon a time", "max_tokens": CAP}).encode()
    port = int(agent.url.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {agent.headers['Authorization'].split()[1]}\r\n".encode()
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    await until(lambda: agent.model_status()["running"] == 1, what="the generation running")
    writer.close()
    await writer.wait_closed()
    await until(lambda: _cancelled(agent) > before, what="the generation cancelled")
    await until(lambda: agent.model_status()["running"] == 0, what="the sequence freed")
    assert await reader.read() == b""  # no answer was sent


def test_a_model_removed_mid_stream_ends_each_stream_with_its_apis_error(
    tmp_path: Path,
) -> None:
    """Once the status line went, an error can only be the stream's last frame: the openai
    client raises it from its SSE ``error`` event, the ollama client from its ``error`` line."""
    long = 200  # two such answers fit the KV budget together (context 512)
    with language_agent(tmp_path, server="drain_timeout_s = 0", max_tokens=CAP) as agent:
        client = openai.OpenAI(base_url=f"{agent.url}/v1", api_key=TOKEN, max_retries=0)
        stream = client.completions.create(
            model=MODEL, prompt="Once upon a time", max_tokens=long, stream=True
        )
        lines = ollama.Client(host=agent.url, headers=agent.headers).generate(
            model=MODEL,
            prompt="Once upon a time",
            raw=True,
            options={"num_predict": long},
            stream=True,
        )
        next(iter(stream)), next(lines)  # both run
        shutil.rmtree(tmp_path / "models" / MODEL)
        agent.process.send_signal(signal.SIGHUP)  # the operator took the model away
        with pytest.raises(openai.APIError, match="unloaded"):
            for _ in stream:
                pass
        with pytest.raises(ollama.ResponseError, match="unloaded"):
            for _ in lines:
                pass
        assert agent.alive()


def test_the_listeners_own_refusals_come_in_openais_shape_on_its_paths(
    agent: LanguageAgent,
) -> None:
    """A form or text body a web page could send (415, the guard), a wrong method (405) and a
    missing token (401) are answered before any route runs, and still in OpenAI's shape."""
    text = requests.post(
        f"{agent.url}/v1/chat/completions",
        data=json.dumps(CHAT),
        headers={**agent.headers, "Content-Type": "text/plain"},
        timeout=30,
    )
    method = requests.get(f"{agent.url}/v1/chat/completions", headers=agent.headers, timeout=30)
    token = requests.get(f"{agent.url}/v1/models", timeout=30)
    for response, status in ((text, 415), (method, 405), (token, 401)):
        assert response.status_code == status
        error = response.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert "POST" in method.headers["Allow"] and token.headers["WWW-Authenticate"] == "Bearer"
    assert isinstance(requests.get(f"{agent.url}/api/tags", timeout=30).json()["error"], str)
