"""The agent's own detection route: ``POST /v1/models/{name}/detect``.

It takes an image body and answers boxes in the image's pixels, best first; ``min_score`` is
this request's threshold. DeepStack's API over the same detectors is ``deepstack_routes``.
"""

from __future__ import annotations

import math

from aiohttp import web

from edgeagent.api.http.app_keys import DATAPLANE
from edgeagent.api.http.body import received_body
from edgeagent.engine.errors import InvalidInput


def score_field(value: str | None, name: str) -> float | None:
    """A 0..1 threshold from a query or form field (None when absent)."""
    if value is None or value == "":
        return None
    try:
        score = float(value)
    except ValueError:
        raise InvalidInput(f"{name} must be a number between 0 and 1, got {value!r}") from None
    if not math.isfinite(score) or not 0 <= score <= 1:
        raise InvalidInput(f"{name} must be between 0 and 1, got {value!r}")
    return score


async def detect_image(request: web.Request) -> web.Response:
    name, version = request.match_info["name"], request.match_info.get("version")
    min_score = score_field(request.query.get("min_score"), "min_score")
    async with received_body(request) as image:
        answer = await request.app[DATAPLANE].detect(name, version, image, min_score)
    return web.json_response(answer)


def detect_routes() -> list[web.RouteDef]:
    return [
        web.post("/v1/models/{name}/detect", detect_image),
    ]
