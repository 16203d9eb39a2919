"""The frames of a streamed answer: OpenAI's SSE events and Ollama's NDJSON lines."""

from __future__ import annotations

import json

from edgeagent.api.http.ollama_routes import Lines
from edgeagent.api.http.openai_requests import OpenAIRequest
from edgeagent.api.http.openai_routes import Answer
from edgeagent.api.http.text_stream import ndjson_line, sse_event
from edgeagent.engine.errors import DeadlineExceeded
from edgeagent.engine.text_requests import GenerationRequest, Usage


class Ended:
    finish_reason = "length"
    usage = Usage(prompt_tokens=5, completion_tokens=2, first_token_s=0.1, total_s=0.2)


def _events(data: bytes) -> list[str]:
    """The data of each SSE event (``data: …`` then a blank line)."""
    assert data.endswith(b"\n\n")
    events = data.decode().split("\n\n")[:-1]
    assert all(event.startswith("data: ") and "\n" not in event for event in events)
    return [event.removeprefix("data: ") for event in events]


def test_an_event_and_a_line_are_one_json_value_each_whatever_the_text() -> None:
    text = 'two\nlines, "quotes" and ünïcode'
    assert json.loads(_events(sse_event({"t": text}))[0]) == {"t": text}
    line = ndjson_line({"t": text})
    assert line.count(b"\n") == 1 and json.loads(line) == {"t": text}


def test_a_chat_stream_opens_with_the_role_and_ends_with_usage_then_done() -> None:
    parsed = OpenAIRequest(GenerationRequest(model="m", prompt="x"), True, include_usage=True)
    answer = Answer(parsed, chat=True)
    first = json.loads(_events(answer.opening())[0])
    assert first["object"] == "chat.completion.chunk"
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    middle = json.loads(_events(answer.text("Hel"))[0])
    assert middle["choices"][0]["delta"] == {"content": "Hel"} and middle["usage"] is None
    last, usage, done = _events(answer.closing(Ended()))  # type: ignore[arg-type]
    assert json.loads(last)["choices"][0]["finish_reason"] == "length"
    assert json.loads(usage)["choices"] == []
    assert json.loads(usage)["usage"] == {
        "prompt_tokens": 5,
        "completion_tokens": 2,
        "total_tokens": 7,
    }
    assert done == "[DONE]"
    assert {json.loads(e)["id"] for e in (last, usage)} == {first["id"]}


def test_a_text_completion_stream_has_no_role_and_no_usage_unless_asked() -> None:
    answer = Answer(OpenAIRequest(GenerationRequest(model="m", prompt="x"), True, False), False)
    assert answer.opening() == b""
    chunk = json.loads(_events(answer.text("a"))[0])
    assert chunk["object"] == "text_completion" and chunk["choices"][0]["text"] == "a"
    assert "usage" not in chunk
    assert _events(answer.closing(Ended()))[-1] == "[DONE]"  # type: ignore[arg-type]
    error = json.loads(_events(answer.error(DeadlineExceeded("too late")))[0])
    assert error["error"]["message"] == "too late" and error["error"]["type"] == "server_error"


def test_ollama_lines_put_the_text_where_each_endpoint_does() -> None:
    chat = json.loads(Lines("m", chat=True).text("a"))
    assert chat["message"] == {"role": "assistant", "content": "a"} and chat["done"] is False
    generate = json.loads(Lines("m", chat=False).text("a"))
    assert generate["response"] == "a" and "message" not in generate
    last = json.loads(Lines("m", chat=True).closing(Ended()))  # type: ignore[arg-type]
    assert last["done"] is True and last["done_reason"] == "length" and last["eval_count"] == 2
    assert json.loads(Lines("m", True).error(DeadlineExceeded("late"))) == {"error": "late"}
