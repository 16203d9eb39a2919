"""The health check of a release before it may stay: its golden inputs give its golden answers
(by task), or a language model replays its golden chats (``updates.text_health``).
"""

from __future__ import annotations

import numpy as np

from edgeagent.fleet import outcomes
from edgeagent.models.golden import GoldenError, load_golden, sample_feeds
from edgeagent.updates.activation import Served
from edgeagent.updates.errors import InstallFailed
from edgeagent.updates.text_health import text_health_check


async def health_check(
    model: Served, timeout_s: float, top_k: int = 1, llm_floor: float = 0.0
) -> None:
    """Run the package's golden inputs and hold the answers to the task's golden record: each
    expected class in the model's top-k for a classifier, every golden box found again
    (IoU-matched, score within the recorded tolerance, no extra confident box) for a detector
    whose golden file holds boxes, tensors within the recorded tolerance otherwise.

    Without golden inputs the model must at least answer the sample feeds with finite outputs.
    A language model replays its golden chats instead (``updates.text_health``).
    """
    package = model.package
    if package.text is not None:
        replay = getattr(model, "replay", None)  # the serving copy's (engine.planes)
        return await text_health_check(package, timeout_s, llm_floor, replay_served=replay)
    try:
        golden = load_golden(package)
    except GoldenError as exc:
        raise InstallFailed(outcomes.HEALTH_CHECK_FAILED, str(exc), bad=True) from exc
    feeds = golden.feeds if golden is not None else sample_feeds(package)
    try:
        outputs = await model.infer(feeds, priority=0, timeout_s=timeout_s)
    except Exception as exc:
        message = f"golden inference failed: {exc}"
        raise InstallFailed(outcomes.HEALTH_CHECK_FAILED, message, bad=True) from exc
    if not all(np.all(np.isfinite(np.asarray(value))) for value in outputs.values()):
        raise InstallFailed(
            outcomes.HEALTH_CHECK_FAILED, "the model answers NaN or infinity", bad=True
        )
    problem = golden.problem(outputs, top_k) if golden is not None else ""
    if problem:
        hint = " ([updates] golden_top_k)" if package.task == "classification" else ""
        raise InstallFailed(outcomes.HEALTH_CHECK_FAILED, problem + hint, bad=True)
