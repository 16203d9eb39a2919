"""The continuous-batching scheduler through the language plane, on the real SmolLM2 GGUF
(context ≤ 512, 2 threads, ≤ 16 tokens a generation unless a test cancels it)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

pytest.importorskip("llama_cpp")
from edgeagent.engine.errors import (
    DeadlineExceeded,
    InvalidInput,
    ModelNotFound,
    QueueFull,
    Throttled,
)
from edgeagent.engine.language.plane import LanguagePlane
from edgeagent.engine.language.settings import LanguageSettings
from edgeagent.engine.limits import ServingLimits
from edgeagent.engine.text_requests import (
    ChatMessage,
    Generation,
    GenerationRequest,
    Sampling,
)
from tests.support.language import write_text_package

FRANCE = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
GREEDY = Sampling(max_tokens=16, temperature=0.0)


@pytest.fixture(scope="module")
def package(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_text_package(tmp_path_factory.mktemp("llm") / "smollm2")


async def _plane(package: Path, **settings: int) -> LanguagePlane:
    fields = {"context": 512, "sequences": 3, "threads": 2, "prefill_chunk": 64, **settings}
    plane = LanguagePlane(LanguageSettings(**fields), metrics=CollectorRegistry())
    await plane.load(package)
    return plane


@pytest.fixture
async def plane(package: Path) -> AsyncIterator[LanguagePlane]:
    served = await _plane(package)
    yield served
    await served.close()


def _chat(text: str, sampling: Sampling = GREEDY, **fields: object) -> GenerationRequest:
    return GenerationRequest(
        "smollm2", messages=(ChatMessage("user", text),), sampling=sampling, **fields
    )  # type: ignore[arg-type]


async def _text(generation: Generation) -> str:
    return "".join([chunk.text async for chunk in generation])


def _status(plane: LanguagePlane) -> dict:
    return plane.status()["models"]["smollm2"]


async def test_sequences_joining_a_running_batch_answer_as_each_alone(plane: LanguagePlane) -> None:
    questions = ["Name three colours.", "Count from one to ten.", "What is a cat?"]
    alone = [await _text(await plane.generate(_chat(q))) for q in questions]
    seeded = Sampling(max_tokens=16, temperature=0.9, seed=11)
    alone_seeded = await _text(await plane.generate(_chat(questions[0], seeded)))

    first = await plane.generate(_chat(questions[0]))
    stream = aiter(first)
    head = [(await anext(stream)).text for _ in range(2)]  # it runs: the others join at step 3+
    second = await plane.generate(_chat(questions[1]))
    second_head = (await anext(aiter(second))).text
    third = await plane.generate(_chat(questions[2]))
    sampled = await plane.generate(_chat(questions[0], seeded))
    rest = await asyncio.gather(_text(first), _text(second), _text(third), _text(sampled))
    joined = ["".join(head) + rest[0], second_head + rest[1], rest[2]]
    assert joined == alone
    assert rest[3] == alone_seeded  # a seed reproduces its text whatever shares the batch
    assert first.finish_reason == "length" and first.usage and first.usage.completion_tokens == 16


async def test_a_cancelled_generation_frees_its_kv_within_one_step(package: Path) -> None:
    registry = CollectorRegistry()
    plane = LanguagePlane(LanguageSettings(context=512, sequences=2, threads=2), metrics=registry)
    await plane.load(package)
    scheduler = plane._models["smollm2"].scheduler
    try:
        generation = await plane.generate(_chat("Write a long story.", Sampling(max_tokens=400)))
        await anext(aiter(generation))
        assert _status(plane)["running"] == 1 and _status(plane)["kv_bytes_used"] > 0
        await generation.aclose()
        await scheduler.iteration()  # the step in flight when it was closed
        await scheduler.iteration()  # the next one frees it
        assert _status(plane)["running"] == 0
        assert _status(plane)["kv_bytes_used"] == 0
        used = registry.get_sample_value(
            "edgeagent_llm_kv_cache_bytes", {"model": "smollm2", "state": "used"}
        )
        assert used == 0
    finally:
        await plane.close()


async def test_a_full_queue_is_429_with_retry_after(package: Path) -> None:
    plane = await _plane(package, sequences=1, queue=1)
    try:
        running = await plane.generate(_chat("Write a long story.", Sampling(max_tokens=400)))
        await anext(aiter(running))
        waiting = asyncio.create_task(plane.generate(_chat("Hello")))
        for _ in range(1000):  # until it is queued (bounded: submit queues before it waits)
            if _status(plane)["waiting"] == 1:
                break
            await asyncio.sleep(0)
        assert _status(plane)["waiting"] == 1
        with pytest.raises(
            QueueFull, match=r"1 requests already wait for one of 1 sequences"
        ) as full:
            await plane.generate(_chat("One more"))
        assert full.value.status == 429 and full.value.retry_after and full.value.retry_after >= 1
        await running.aclose()
        admitted = await waiting  # the freed sequence goes to the one that waited
        assert await _text(admitted)
    finally:
        await plane.close()


async def test_bad_requests_are_refused_before_any_chunk_naming_the_limits(
    plane: LanguagePlane,
) -> None:
    with pytest.raises(
        InvalidInput,
        match=r"the prompt is \d{3,} tokens but the context of model 'smollm2' is 512 tokens",
    ):
        await plane.generate(GenerationRequest("smollm2", prompt="word " * 600))
    with pytest.raises(InvalidInput, match=r"the prompt is \d{4,} tokens but the context"):
        await plane.generate(GenerationRequest("smollm2", prompt="word " * 5000))  # off the loop
    with pytest.raises(InvalidInput, match=r"stop: at most 16 strings of 1 to 256 characters"):
        await plane.generate(_chat("hi", Sampling(stop=("x" * 257,))))
    with pytest.raises(
        InvalidInput, match=r"max_tokens: 5000 is not between 1 and the agent's cap of 2048"
    ):
        await plane.generate(_chat("hi", Sampling(max_tokens=5000)))
    with pytest.raises(InvalidInput, match=r"messages\[0\].role: 'wizard' is not one of system"):
        await plane.generate(GenerationRequest("smollm2", messages=(ChatMessage("wizard", "x"),)))
    with pytest.raises(InvalidInput, match="top_p"):
        await plane.generate(_chat("hi", Sampling(top_p=0.0)))
    with pytest.raises(ModelNotFound, match=r"no language model 'gpt-4' \(served: smollm2\)"):
        await plane.generate(GenerationRequest("gpt-4", prompt="hi"))
    assert _status(plane)["running"] == 0 and _status(plane)["waiting"] == 0


async def test_deadlines_end_a_wait_and_a_generation(package: Path) -> None:
    plane = await _plane(package, sequences=1)
    try:
        running = await plane.generate(_chat("Write a long story.", Sampling(max_tokens=400)))
        await anext(aiter(running))
        with pytest.raises(DeadlineExceeded, match="no sequence was free"):
            await plane.generate(_chat("Hello", timeout_s=0.05))
        await running.aclose()
        with pytest.raises(DeadlineExceeded, match="deadline passed after"):
            late = await plane.generate(
                _chat("Write a long story.", Sampling(max_tokens=400), timeout_s=0.3)
            )
            await _text(late)
    finally:
        await plane.close()


async def test_a_stop_string_ends_the_answer_before_it(plane: LanguagePlane) -> None:
    whole = await _text(
        await plane.generate(GenerationRequest("smollm2", prompt=FRANCE, sampling=GREEDY))
    )
    assert "Paris" in whole
    stopped = await plane.generate(
        GenerationRequest(
            "smollm2",
            prompt=FRANCE,
            sampling=Sampling(max_tokens=16, temperature=0, stop=("Paris",)),
        )
    )
    assert await _text(stopped) == whole.split("Paris")[0]
    assert stopped.finish_reason == "stop"


async def test_the_governor_sheds_the_lowest_priority(package: Path) -> None:
    limits = ServingLimits(shed_priority_from=2, retry_after_s=7, reason="hot: 91 °C")
    plane = LanguagePlane(
        LanguageSettings(context=512, sequences=2, threads=2), limits=lambda: limits
    )
    await plane.load(package)
    try:
        with pytest.raises(
            Throttled, match="priority 2 requests are shed now \\(hot: 91 °C\\)"
        ) as shed:
            await plane.generate(_chat("hi"))  # the default priority, 2
        assert shed.value.status == 503 and shed.value.retry_after == 7
        assert await _text(await plane.generate(_chat("hi", priority=1)))
    finally:
        await plane.close()


async def test_a_repeated_prompt_reuses_the_cached_prefix(plane: LanguagePlane) -> None:
    registry = plane._metrics.tokens
    first = await _text(await plane.generate(_chat("What is the capital of Italy?")))
    kept = _status(plane)
    assert kept["kv_bytes_used"] == 0 and kept["kv_bytes_cached"] > 0  # reusable, not in use
    again = await plane.generate(_chat("What is the capital of Italy?"))
    assert await _text(again) == first
    cached = registry.labels("smollm2", "prompt_cached")._value.get()
    assert again.usage and cached == again.usage.prompt_tokens - 1


async def test_a_new_version_swaps_in_and_the_old_one_finishes(
    plane: LanguagePlane, tmp_path: Path
) -> None:
    old = await plane.generate(_chat("Name three colours."))
    head = (await anext(aiter(old))).text
    newer = write_text_package(tmp_path / "smollm2", version="1.1.0")
    info = await plane.load(newer)
    assert info.version == "1.1.0" and [m.version for m in plane.models()] == ["1.1.0"]
    assert head + await _text(old)  # the old version finished its stream
    assert old.finish_reason == "length"
    assert await _text(await plane.generate(_chat("hi")))
