"""``POST /v1/models/{name}/classify``: image bytes in, labelled top-k out.

Kept free of aiohttp so the whole path (decode → preprocess → engine → top-k) is one coroutine
that the HTTP handler only frames; decoding and resizing run in a worker thread because a large
JPEG takes milliseconds of CPU that would otherwise stall every other request on the loop.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from edgeagent.models.preprocess import preprocess_image, top_k
from edgeagent.serving.errors import InvalidInput


def parse_top_k(value: str | None, default: int, classes: int) -> int:
    """The ``top_k`` query parameter: 1..classes, the package's default when absent."""
    if value is None:
        return min(default, classes)
    try:
        k = int(value)
    except ValueError:
        raise InvalidInput(f"query parameter top_k must be an integer, got {value!r}") from None
    if not 1 <= k <= classes:
        raise InvalidInput(f"query parameter top_k must be between 1 and {classes}, got {k}")
    return k


async def classify(
    model: Any, image: bytes, k: str | None, decode_slots: asyncio.Semaphore
) -> dict[str, Any]:
    """Run one image through ``model`` (a registry LoadedModel) and describe the answer.

    ``decode_slots`` bounds how many images are decoded at once (each may take ~120 MB).
    """
    package = model.package
    if package.preprocess is None:
        raise InvalidInput(
            f"model {package.name!r} has no [preprocess] section, so it cannot take images; "
            f"send tensors to /v2/models/{package.name}/infer instead"
        )
    output = package.outputs[0]
    k_value = parse_top_k(k, package.postprocess.top_k, output.shape[-1])
    started = time.perf_counter()
    try:
        async with decode_slots:
            tensor = await asyncio.to_thread(preprocess_image, image, package.preprocess)
    except ValueError as exc:
        raise InvalidInput(f"request body: {exc}") from None
    outputs = await model.infer({package.inputs[0].name: tensor})
    predictions = top_k(
        outputs[output.name][0], package.labels, k_value, package.postprocess.softmax
    )
    latency_ms = (time.perf_counter() - started) * 1000.0
    backend = model.backend
    return {
        "model_name": package.name,
        "model_version": model.version,
        "labels": [p.label for p in predictions],
        "scores": [p.score for p in predictions],
        "indices": [p.index for p in predictions],
        "backend": backend["runtime"],
        "device": backend["device"],
        "precision": backend["precision"],
        "latency_ms": round(latency_ms, 3),
    }
