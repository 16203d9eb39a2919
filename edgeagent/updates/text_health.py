"""The health check of a language model's release: its golden chats, replayed on the device.

A text-generation package records, per variant, the greedy token ids of its golden chats and
the decode rate measured at packaging (``models.text_golden``). Before a release takes
traffic the installed variant must give exactly those tokens — a damaged file, a wrong
quantization or a broken runtime build all change them — and decode at least
``[updates] llm_tokens_per_second_floor`` × the recorded rate (a build that fell back to
scalar code answers right but ten times slower). The record is the packaging machine's, so the
floor is a fraction, not a figure.

The chats run on the copy the language plane placed for the release but does not serve yet
(``replay_served``: ``Planes.stage``), which activation then serves as it is: the model is
loaded once, checked on the device and variant that will serve it, and held to that variant's
record. Without such a copy (an activator that cannot stage) the first installed variant is
loaded here, on the CPU, with one sequence and a context just long enough for the longest
chat, and closed before the check returns.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from edgeagent.fleet import outcomes
from edgeagent.models.package import ModelPackage, Variant
from edgeagent.models.text_golden import (
    PREFILL_CHUNK,
    Replay,
    TextGolden,
    TextGoldenError,
    load_text_golden,
    replay,
    replay_problem,
)
from edgeagent.runtimes.facts import GENERATIVE_RUNTIMES
from edgeagent.runtimes.generative import GenerativeLoadRequest
from edgeagent.updates.errors import InstallFailed

FLOOR_KEY = "[updates] llm_tokens_per_second_floor"


def _failed(message: str) -> InstallFailed:
    return InstallFailed(outcomes.HEALTH_CHECK_FAILED, message, bad=True)


Replayer = Callable[[TextGolden], Awaitable[tuple[str, Replay] | None]]


async def text_health_check(
    package: ModelPackage,
    timeout_s: float,
    floor: float,
    threads: int | None = None,
    replay_served: Replayer | None = None,
) -> None:
    """Raise InstallFailed (``health_check_failed``, the release marked bad) unless the
    package's first installed generative variant repeats its golden record within the floor."""
    if package.golden is None:
        raise _failed(f"{package.name} {package.version}: a language model needs its golden.json")
    try:
        golden = load_text_golden(package.golden)
    except TextGoldenError as exc:
        raise _failed(str(exc)) from exc
    variant = next((v for v in package.variants if v.runtime in GENERATIVE_RUNTIMES), None)
    if variant is None:
        raise _failed(f"{package.name} {package.version}: no variant on a language-model runtime")
    key = variant.key
    try:
        served = await asyncio.wait_for(replay_served(golden), timeout_s) if replay_served else None
        if served is not None:
            key, answer = served
        else:
            answer = await asyncio.wait_for(
                asyncio.to_thread(_replay, variant, golden, threads), timeout_s
            )
    except asyncio.TimeoutError as exc:
        raise _failed(f"the golden chats took longer than {timeout_s:g} s") from exc
    except Exception as exc:
        raise _failed(f"golden generation with {key} failed: {exc}") from exc
    problem = replay_problem(golden, key, answer, floor)
    if problem:
        hint = f" ({FLOOR_KEY})" if problem.startswith("decodes") else ""
        raise _failed(f"{package.name} {package.version} {key}: {problem}{hint}")


def _replay(variant: Variant, golden: TextGolden, threads: int | None) -> Replay:
    from edgeagent.runtimes import get_runtime

    longest = max(len(p.prompt_tokens) for p in golden.prompts) + golden.max_tokens
    context = -(-longest // PREFILL_CHUNK) * PREFILL_CHUNK  # whole chunks: 256, 512 …
    request = GenerativeLoadRequest(
        files=variant.files,
        context=context,
        sequences=1,
        batch_tokens=PREFILL_CHUNK,
        threads=threads or (golden.threads or None),
    )
    runtime: Any = get_runtime(variant.runtime)  # a GenerativeRuntime
    session = runtime.load(request)
    try:
        return replay(session, golden)
    finally:
        session.close()
