"""The JSON helper process (edgeagent.api.jsonparse.helper): a real child process parses bodies into
the same message the daemon's own parser gives; whatever it cannot take, a helper that dies, is
cancelled mid-body or cannot start, ends in None (the caller parses itself), never in a wrong
or lost answer."""

from __future__ import annotations

import asyncio
import json
import mmap
import os
import sys
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from edgeagent.api import v2
from edgeagent.api.jsonparse import helper as json_helper
from edgeagent.api.jsonparse.helper import JsonHelper
from edgeagent.api.jsonparse.helper_process import NOT_TAKEN, reply_for


@pytest.fixture
def executor() -> Iterator[ThreadPoolExecutor]:
    with ThreadPoolExecutor(1) as pool:
        yield pool


@pytest.fixture
async def helper(executor: ThreadPoolExecutor) -> AsyncIterator[JsonHelper]:
    parser = JsonHelper(1 << 20, executor)
    yield parser
    await parser.close()


def _body(values: Any, datatype: str = "FP32", **extra: Any) -> bytes:
    tensor = {"name": "input", "shape": [len(values)], "datatype": datatype, "data": values}
    return json.dumps({"inputs": [tensor], **extra}).encode()


def _helper_view(message: Any) -> Any:
    """``v2.parse_json_object``'s message as the helper gives it: FP32 tensors' doubles already
    rounded to float32 (what the decoder does next either way)."""
    for key in ("inputs", "outputs"):
        entries = message.get(key) if isinstance(message, dict) else None
        for entry in entries if isinstance(entries, list) else []:
            data = entry.get("data") if isinstance(entry, dict) else None
            if isinstance(data, np.ndarray) and entry.get("datatype") == "FP32":
                entry["data"] = data.astype(np.float32)
    return message


def _same(got: Any, expected: Any) -> bool:
    """Equal messages, float tensors compared as arrays (dtype and bits included)."""
    if isinstance(expected, np.ndarray):
        return (
            isinstance(got, np.ndarray)
            and got.dtype == expected.dtype
            and np.array_equal(got, expected)
        )
    if isinstance(expected, dict):
        return (
            isinstance(got, dict)
            and got.keys() == expected.keys()
            and all(_same(got[k], expected[k]) for k in expected)
        )
    if isinstance(expected, list):
        return (
            isinstance(got, list)
            and len(got) == len(expected)
            and all(_same(g, e) for g, e in zip(got, expected, strict=True))
        )
    return type(got) is type(expected) and got == expected


async def test_a_body_parses_into_the_message_the_daemon_would_parse(helper: JsonHelper) -> None:
    values = np.random.default_rng(0).standard_normal(5000).astype(np.float32).tolist()
    body = _body(
        values,
        id="r-1",
        parameters={"note": 'ümlaut \u2603 \\ "q"', "n": 2**63, "nested": [[1, 2], {"a": None}]},
        outputs=[{"name": "logits", "parameters": {"binary_data": True}}],
    )
    parsed = await helper.parse(body)
    assert parsed is not None and parsed.light and helper.pid is not None
    message = parsed.message
    assert _same(message, _helper_view(v2.parse_json_object(body)))
    assert isinstance(message["inputs"][0]["data"], np.ndarray)  # an array, not a list
    request = v2.decode_message(message, memoryview(b""))
    np.testing.assert_array_equal(request.inputs["input"], np.array(values, np.float32))


async def test_integer_tensors_and_several_float_tensors_keep_their_places(
    helper: JsonHelper,
) -> None:
    body = json.dumps(
        {
            "inputs": [
                {"name": "a", "shape": [3], "datatype": "FP64", "data": [0.1, -2, 3e300]},
                {"name": "b", "shape": [2], "datatype": "INT64", "data": [7, -(2**63)]},
                {"name": "c", "shape": [2, 2], "datatype": "FP32", "data": [[1, 2], [3, 4]]},
                {"name": "d", "shape": [0], "datatype": "FP16", "data": []},
            ]
        }
    ).encode()
    parsed = await helper.parse(body)
    assert parsed is not None and _same(parsed.message, _helper_view(v2.parse_json_object(body)))


async def test_a_message_heavy_beside_its_float_tensors_is_read_off_the_loop(
    helper: JsonHelper,
) -> None:
    ints = list(range(-5000, 5000))
    body = json.dumps(
        {"inputs": [{"name": "i", "shape": [len(ints)], "datatype": "INT64", "data": ints}]}
    ).encode()
    parsed = await helper.parse(body)
    assert parsed is not None and not parsed.light  # 10,000 numbers of JSON in the reply
    assert _same(parsed.message, _helper_view(v2.parse_json_object(body)))


@pytest.mark.parametrize(
    "body",
    [
        b'{"inputs": [{"name": "x", "data": [NaN]}]}',  # the lenient parser's own rules
        b'{"inputs": [',
        b"[1, 2, 3]",
        b'{"a\\u0000b": 1}',
        b"\xff\xfe{}",
    ],
)
async def test_what_the_fast_path_does_not_take_is_left_to_the_daemon(
    helper: JsonHelper, body: bytes
) -> None:
    assert await helper.parse(_body([1.0])) is not None
    pid = helper.pid
    assert await helper.parse(body) is None
    assert await helper.parse(_body([2.0])) is not None and helper.pid == pid  # still the same


async def test_a_body_over_the_limit_never_starts_the_helper(executor: ThreadPoolExecutor) -> None:
    parser = JsonHelper(100, executor)
    try:
        assert await parser.parse(_body([1.0] * 50)) is None and parser.pid is None
    finally:
        await parser.close()


async def test_a_helper_that_died_is_replaced_and_no_body_is_lost(helper: JsonHelper) -> None:
    assert await helper.parse(_body([1.0])) is not None
    first = psutil.Process(helper.pid)
    first.kill()
    first.wait(5)
    answers = [await helper.parse(_body([float(i)])) for i in range(3)]
    assert all(a is not None for a in answers)  # the exit is seen before the body is sent
    data = [a.message["inputs"][0]["data"].tolist() for a in answers]  # type: ignore[union-attr]
    assert data == [[0.0], [1.0], [2.0]]
    assert helper.pid is not None and helper.pid != first.pid


async def test_a_helper_killed_mid_body_yields_none_then_a_new_helper(
    helper: JsonHelper, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert await helper.parse(_body([1.0])) is not None
    first = psutil.Process(helper.pid)
    first.suspend()  # alive, but it cannot answer
    asked = asyncio.Event()
    ask = json_helper._Channel.ask

    async def spied(channel: json_helper._Channel, data: bytes | memoryview) -> bytes:
        asked.set()
        return await ask(channel, data)

    monkeypatch.setattr(json_helper._Channel, "ask", spied)
    pending = asyncio.ensure_future(helper.parse(_body([3.0] * 1000)))
    await asked.wait()
    first.kill()  # dies with the body in flight
    assert await pending is None
    again = await helper.parse(_body([4.0]))
    assert again is not None and again.message["inputs"][0]["data"].tolist() == [4.0]
    assert helper.pid != first.pid


async def test_a_cancelled_parse_never_mixes_up_the_next_body(helper: JsonHelper) -> None:
    big = np.arange(100_000, dtype=np.float64).tolist()
    for _ in range(3):
        task = asyncio.ensure_future(helper.parse(_body(big)))
        await asyncio.sleep(0)
        task.cancel()
        answer = await helper.parse(_body([9.5, 8.5]))
        assert answer is not None and answer.message["inputs"][0]["data"].tolist() == [9.5, 8.5]


async def test_close_stops_the_process_and_no_helper_starts_after(helper: JsonHelper) -> None:
    assert await helper.parse(_body([1.0])) is not None
    process = psutil.Process(helper.pid)
    await helper.close()
    assert not process.is_running()
    assert await helper.parse(_body([1.0])) is None and helper.pid is None


async def test_without_memfd_the_helper_is_off(
    executor: ThreadPoolExecutor, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(os, "memfd_create")
    parser = JsonHelper(1 << 20, executor)
    assert not parser.enabled and await parser.parse(_body([1.0])) is None


async def test_a_helper_that_cannot_start_is_left_off_after_three_tries(
    executor: ThreadPoolExecutor, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(json_helper.sys, "executable", "/nonexistent/python")
    parser = JsonHelper(1 << 20, executor)
    for _ in range(json_helper.MAX_START_FAILURES):
        assert parser.enabled and await parser.parse(_body([1.0])) is None
    assert not parser.enabled
    assert "large JSON bodies are parsed in the daemon" in caplog.text


def test_doubles_that_do_not_fit_the_target_are_not_taken() -> None:
    body = _body([1.5] * 100)
    with mmap.mmap(-1, len(body)) as source, mmap.mmap(-1, 799) as target:
        source[: len(body)] = body
        assert reply_for(source, len(body), target) == NOT_TAKEN  # 100 doubles need 800
        assert reply_for(source, len(source) + 1, target) == NOT_TAKEN  # past the region
    with mmap.mmap(-1, len(body)) as source, mmap.mmap(-1, 800) as target:
        source[: len(body)] = body
        assert json.loads(reply_for(source, len(body), target))["arrays"] == [["inputs", 0, 0, 100]]


def _page_faults(pid: int) -> int:
    """Minor page faults of a process so far (/proc/PID/stat, field 10)."""
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[7])


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None,
    reason="glibc's malloc",
)
async def test_the_helper_keeps_its_freed_memory_and_faults_no_pages_in_per_body(
    executor: ThreadPoolExecutor,
) -> None:
    """With glibc's defaults the helper faulted ~1,900 pages in afresh for every parse of a
    1.8 MB body (12 ms instead of 5.3); it keeps its freed blocks instead."""
    body = _body([i * 0.001 for i in range(150_000)])
    helper = JsonHelper(4 << 20, executor)
    try:
        for _ in range(3):
            assert await helper.parse(body) is not None
        assert helper.pid is not None
        before = _page_faults(helper.pid)
        for _ in range(5):
            assert await helper.parse(body) is not None
        per_body = (_page_faults(helper.pid) - before) / 5
    finally:
        await helper.close()
    assert per_body < 50, per_body


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
_tensors = st.fixed_dictionaries(
    {
        "name": st.text(min_size=1, max_size=8),
        "datatype": st.sampled_from(["FP32", "FP64", "FP16", "INT32", "BOOL"]),
        "data": st.one_of(
            st.lists(st.floats(allow_nan=False, allow_infinity=False, width=32), max_size=50),
            st.lists(st.integers(-100, 100), max_size=20),
            _values,
        ),
    },
    optional={"shape": st.lists(st.integers(0, 9), max_size=3), "parameters": _values},
)
_messages = st.fixed_dictionaries(
    {"inputs": st.lists(_tensors, max_size=3)},
    optional={
        "id": st.text(max_size=10),
        "parameters": _values,
        "outputs": st.lists(_tensors, max_size=2),
    },
)


@pytest.fixture(scope="module")
def one_helper() -> Iterator[tuple[asyncio.AbstractEventLoop, JsonHelper]]:
    """One helper process for every example (a start per example would cost ~0.1 s)."""
    loop = asyncio.new_event_loop()
    with ThreadPoolExecutor(1) as pool:
        parser = JsonHelper(1 << 20, pool)
        yield loop, parser
        loop.run_until_complete(parser.close())
    loop.close()


@settings(max_examples=80, deadline=None)
@given(message=_messages)
def test_any_message_parses_as_the_daemon_parses_it(
    message: dict, one_helper: tuple[asyncio.AbstractEventLoop, JsonHelper]
) -> None:
    loop, parser = one_helper
    body = json.dumps(message).encode()
    got = loop.run_until_complete(parser.parse(body))
    if got is not None:
        assert _same(got.message, _helper_view(v2.parse_json_object(body)))
    else:  # simdjson cannot look up a key holding NUL: only such a body is left to the daemon
        assert any("\0" in key for key in _keys_of(message))


def _keys_of(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for key, inner in value.items():
            yield key
            yield from _keys_of(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from _keys_of(inner)
