"""OpenAI's request bodies → the engine's types, and each refusal naming its field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from edgeagent.api.http.openai_requests import (
    chat_request,
    completion_request,
    embedding_request,
    error_body,
)
from edgeagent.api.http.openai_routes import is_openai_path
from edgeagent.api.http.text_fields import FieldError, parse_json_body
from edgeagent.engine.text_requests import ChatMessage, Sampling

USER = {"role": "user", "content": "hi"}


def _chat(**fields: Any) -> dict[str, Any]:
    return {"model": "smollm2", "messages": [USER], **fields}


def test_a_chat_body_becomes_the_engines_request_with_every_sampling_field() -> None:
    parsed = chat_request(
        _chat(
            messages=[
                {"role": "developer", "content": "be brief"},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                },
                {"role": "assistant", "content": None, "tool_calls": []},
            ],
            max_completion_tokens=7,
            max_tokens=99,
            temperature=0,
            top_p=0.5,
            top_k=4,
            seed=3,
            stop="END",
            stream=True,
            stream_options={"include_usage": True},
            user="someone",
            presence_penalty=0.5,
        )
    )
    assert parsed.generation.model == "smollm2" and parsed.generation.prompt is None
    assert parsed.generation.messages == (
        ChatMessage("system", "be brief"),
        ChatMessage("user", "ab"),
        ChatMessage("assistant", ""),
    )
    assert parsed.generation.sampling == Sampling(
        max_tokens=7, temperature=0.0, top_p=0.5, top_k=4, seed=3, stop=("END",)
    )
    assert parsed.stream and parsed.include_usage


def test_defaults_leave_the_engine_to_decide_the_length() -> None:
    parsed = chat_request(_chat())
    assert parsed.generation.sampling == Sampling()
    assert not parsed.stream and not parsed.include_usage


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role", "'wizard'"),
        ({"messages": [USER, {"content": "x"}]}, "messages[1].role", "required"),
        ({"messages": []}, "messages", "non-empty"),
        ({"messages": "hi"}, "messages", "non-empty array"),
        ({"messages": [USER, "hi"]}, "messages[1]", "object"),
        ({"model": 3}, "model", "string, not an integer"),
        ({"model": None}, "model", "required"),
        ({"n": 2}, "n", "must be 1"),
        ({"max_tokens": 0}, "max_tokens", "at least 1"),
        ({"max_tokens": "16"}, "max_tokens", "integer, not a string"),
        ({"max_completion_tokens": 1.5}, "max_completion_tokens", "integer"),
        ({"temperature": 3}, "temperature", "between 0 and 2"),
        ({"temperature": True}, "temperature", "number, not a boolean"),
        ({"top_p": -0.1}, "top_p", "between 0 and 1"),
        ({"seed": "x"}, "seed", "integer"),
        ({"stop": ["a", 3]}, "stop", "array of strings"),
        ({"stop": [""]}, "stop", "empty string"),
        ({"stream": "yes"}, "stream", "true or false"),
        ({"stream_options": {"include_usage": True}}, "stream_options", "only allowed"),
        ({"tools": [{"type": "function"}]}, "tools", "do not call tools"),
        ({"tool_choice": "required"}, "tool_choice", "not supported"),
        ({"logprobs": True}, "logprobs", "not reported"),
        ({"response_format": {"type": "json_object"}}, "response_format", "json_object"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
            "messages[0].content[0]",
            "only text parts",
        ),
        ({"presence_penalty": 9}, "presence_penalty", "between -2 and 2"),
    ],
)
def test_a_wrong_field_is_refused_naming_it(fields: dict, param: str, words: str) -> None:
    with pytest.raises(FieldError) as refused:
        chat_request(_chat(**fields))
    assert refused.value.status == 400 and refused.value.param == param
    assert words in refused.value.message


def test_a_completion_takes_one_text_prompt_and_nothing_else() -> None:
    parsed = completion_request({"model": "m", "prompt": ["Once"], "max_tokens": 4})
    assert parsed.generation.prompt == "Once" and parsed.generation.messages is None
    assert parsed.generation.sampling.max_tokens == 4
    for fields, param in [
        ({"prompt": [1, 2, 3]}, "prompt"),
        ({"prompt": ["a", "b"]}, "prompt"),
        ({"echo": True}, "echo"),
        ({"suffix": "end"}, "suffix"),
        ({"best_of": 3}, "best_of"),
    ]:
        with pytest.raises(FieldError) as refused:
            completion_request({"model": "m", "prompt": "x", **fields})
        assert refused.value.param == param


def test_embedding_inputs_and_their_encoding() -> None:
    parsed = embedding_request({"model": "e", "input": "one", "encoding_format": "base64"})
    assert parsed.inputs == ("one",) and parsed.base64
    assert embedding_request({"model": "e", "input": ["a", "b"]}).inputs == ("a", "b")
    for fields, param in [
        ({"input": [[1, 2]]}, "input"),
        ({"input": []}, "input"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "x", "dimensions": 64}, "dimensions"),
    ]:
        with pytest.raises(FieldError) as refused:
            embedding_request({"model": "e", **fields})
        assert refused.value.param == param


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b"", "empty"),
        (b'{"model": ', "not valid JSON"),
        (b"[1, 2]", "must be a JSON object"),
        (b'{"temperature": NaN}', "NaN"),
        (b"\xff\xfe{}", "not valid JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "not valid JSON"),
    ],
)
def test_a_broken_body_is_a_400_saying_why(body: bytes, words: str) -> None:
    with pytest.raises(FieldError) as refused:
        parse_json_body(body)
    assert refused.value.status == 400 and words in refused.value.message


def test_errors_have_openais_shape_and_types() -> None:
    body = error_body(400, "bad", param="n")
    assert body == {
        "error": {"message": "bad", "type": "invalid_request_error", "param": "n", "code": None}
    }
    assert error_body(401, "no")["error"]["code"] == "invalid_api_key"
    assert error_body(429, "busy")["error"]["type"] == "rate_limit_error"
    assert error_body(500, "oops")["error"]["type"] == "server_error"
    assert json.loads(json.dumps(body)) == body


def test_openais_paths_and_not_the_agents_own() -> None:
    assert is_openai_path("/v1/chat/completions") and is_openai_path("/v1/models/smollm2")
    assert is_openai_path("/v1/chat/completion") is False  # a typo: the router's 404 stays plain
    assert not is_openai_path("/v1/models/tiny/classify") and not is_openai_path("/v1/status")
