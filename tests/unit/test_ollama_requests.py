"""Ollama's request bodies → the engine's types; the options it applies and those it ignores."""

from __future__ import annotations

import pytest

from edgeagent.api.http.ollama_requests import chat_request, embed_inputs, generate_request
from edgeagent.api.http.ollama_routes import counters, parameter_size, timestamp
from edgeagent.api.http.text_fields import FieldError
from edgeagent.engine.text_requests import ChatMessage, Sampling, Usage

USER = {"role": "user", "content": "hi"}


def test_a_chat_streams_by_default_and_applies_its_options() -> None:
    options = {
        "num_predict": 5,
        "temperature": 0.5,
        "top_p": 0.9,
        "top_k": 40,
        "seed": 1,
        "stop": ["\n"],
        # Frigate's tuning for Ollama: accepted, no effect here
        "repeat_penalty": 1.05,
        "presence_penalty": 0.3,
        "num_ctx": 4096,
    }
    parsed = chat_request({"model": "smollm2:latest", "messages": [USER], "options": options})
    assert parsed.stream and parsed.model == "smollm2"
    assert parsed.generation is not None
    assert parsed.generation.messages == (ChatMessage("user", "hi"),)
    assert parsed.generation.sampling == Sampling(
        max_tokens=5, temperature=0.5, top_p=0.9, top_k=40, seed=1, stop=("\n",)
    )


def test_no_limit_means_the_agents_default() -> None:
    for limit in (-1, -2):
        parsed = chat_request({"model": "m", "messages": [USER], "options": {"num_predict": limit}})
        assert parsed.generation is not None and parsed.generation.sampling.max_tokens is None


def test_no_messages_or_an_empty_prompt_only_loads_the_model() -> None:
    assert chat_request({"model": "m", "stream": False}).generation is None
    assert generate_request({"name": "m"}).generation is None


def test_generate_wraps_the_prompt_in_the_template_unless_raw() -> None:
    templated = generate_request({"model": "m", "prompt": "hi", "system": "be brief"})
    assert templated.generation is not None
    assert templated.generation.messages == (
        ChatMessage("system", "be brief"),
        ChatMessage("user", "hi"),
    )
    raw = generate_request({"model": "m", "prompt": "<|im_start|>", "raw": True, "stream": False})
    assert raw.generation is not None and raw.generation.prompt == "<|im_start|>"
    assert not raw.stream


@pytest.mark.parametrize(
    ("body", "param", "words"),
    [
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role", "'robot'"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "string"),
        ({"messages": [{**USER, "images": ["aGk="]}]}, "messages[0].images", "images"),
        ({"messages": [USER], "tools": [{}]}, "tools", "does not support tools"),
        ({"messages": [USER], "think": True}, "think", "thinking"),
        ({"messages": [USER], "format": "json"}, "format", "structured output"),
        ({"messages": [USER], "options": {"num_predict": "8"}}, "options.num_predict", "integer"),
        ({"messages": [USER], "options": {"temperature": -1}}, "options.temperature", "between"),
        ({"messages": [USER], "options": {"stop": 3}}, "options.stop", "strings"),
        ({"messages": [USER], "options": []}, "options", "object"),
        ({"messages": [USER], "stream": "no"}, "stream", "true or false"),
        ({"messages": {}}, "messages", "array"),
    ],
)
def test_a_wrong_chat_field_is_refused_naming_it(body: dict, param: str, words: str) -> None:
    with pytest.raises(FieldError) as refused:
        chat_request({"model": "smollm2", **body})
    assert refused.value.status == 400 and refused.value.param == param
    assert words in refused.value.message


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prompt": "x", "images": ["aGk="]}, "images"),
        ({"prompt": "x", "suffix": "y"}, "suffix"),
        ({"prompt": "x", "context": [1, 2]}, "context"),
        ({"prompt": 3}, "prompt"),
        ({"prompt": "x", "raw": 1}, "raw"),
        ({}, "model"),
    ],
)
def test_a_wrong_generate_field_is_refused_naming_it(body: dict, param: str) -> None:
    with pytest.raises(FieldError) as refused:
        generate_request({"model": "smollm2", **body} if body else {})
    assert refused.value.param == param


def test_embedding_inputs() -> None:
    assert embed_inputs({"input": "a"}, "input") == ("a",)
    assert embed_inputs({"input": ["a", "b"]}, "input") == ("a", "b")
    with pytest.raises(FieldError):
        embed_inputs({"input": [1]}, "input")


class Ended:
    def __init__(self, usage: Usage | None) -> None:
        self.finish_reason = "stop"
        self.usage = usage


def test_the_last_line_counts_tokens_and_nanoseconds() -> None:
    last = counters(
        Ended(Usage(prompt_tokens=9, completion_tokens=4, first_token_s=0.25, total_s=1.0))
    )  # type: ignore[arg-type]
    assert last == {
        "done_reason": "stop",
        "total_duration": 1_000_000_000,
        "load_duration": 0,
        "prompt_eval_count": 9,
        "prompt_eval_duration": 250_000_000,
        "eval_count": 4,
        "eval_duration": 750_000_000,
    }
    assert counters(Ended(None)) == {"done_reason": "stop"}  # type: ignore[arg-type]


def test_ollamas_number_and_time_formats() -> None:
    assert parameter_size(134_515_008) == "135M" and parameter_size(1_540_000_000) == "1.54B"
    assert timestamp(0) == "1970-01-01T00:00:00Z"
