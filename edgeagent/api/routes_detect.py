"""Detection over HTTP: the agent's own route and the DeepStack-compatible one.

``POST /v1/models/{name}/detect`` takes an image body and answers boxes in the image's pixels.
``POST /v1/vision/detection`` speaks DeepStack's API — a multipart ``image`` field, optional
``min_confidence`` and ``api_key`` — which Frigate's ``deepstack`` detector, Home Assistant,
Blue Iris and Viseron already send to a local "AI server": pointed at the agent, they get its
accelerator choice, governor and signed updates with no change on their side. Its answers and
errors keep DeepStack's shape (``success``, ``predictions`` best first, ``duration``).
"""

from __future__ import annotations

import email.parser
import email.policy
import math
import time
from typing import Any

from aiohttp import web

from edgeagent.api.auth import form_credentials, over_tcp, presented_token, scope_problem
from edgeagent.api.body import received_body
from edgeagent.api.keys import DATAPLANE, SETTINGS
from edgeagent.engine.errors import InvalidInput, ModelNotFound, ServingError

MAX_FORM_PARTS = 8  # image, min_confidence, api_key and a few a client may add


def _score(value: str | None, name: str) -> float | None:
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
    min_score = _score(request.query.get("min_score"), "min_score")
    async with received_body(request) as image:
        answer = await request.app[DATAPLANE].detect(name, version, image, min_score)
    return web.json_response(answer)


def parse_form(body: bytes, content_type: str | None) -> dict[str, bytes]:
    """The fields of a ``multipart/form-data`` body (field name → bytes), with the stdlib's
    MIME parser; InvalidInput for anything that is not a small, well-formed form."""
    if not content_type or not content_type.lower().startswith("multipart/form-data"):
        raise InvalidInput("send the image as multipart/form-data with a field named 'image'")
    header = f"Content-Type: {content_type}\r\nMIME-Version: 1.0\r\n\r\n".encode("latin-1")
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(header + body)
    if not message.is_multipart():
        raise InvalidInput("the multipart/form-data body has no parts (boundary missing?)")
    fields: dict[str, bytes] = {}
    for index, part in enumerate(message.iter_parts()):
        if index >= MAX_FORM_PARTS:
            raise InvalidInput(f"more than {MAX_FORM_PARTS} form fields")
        field = part.get_param("name", header="content-disposition")
        if not isinstance(field, str) or not field:
            raise InvalidInput("a form part has no name")
        payload = part.get_payload(decode=True)
        fields[field] = payload if isinstance(payload, bytes) else b""
    return fields


def _deepstack_error(status: int, message: str) -> web.Response:
    return web.json_response({"success": False, "error": message, "duration": 0}, status=status)


@form_credentials
async def deepstack_detection(request: web.Request) -> web.Response:
    """DeepStack's ``POST /v1/vision/detection`` served by ``[server] deepstack_model``."""
    started = time.perf_counter()
    settings = request.app[SETTINGS]
    try:
        if not settings.deepstack_model:
            raise ModelNotFound(
                "no detection model answers DeepStack requests: set [server] deepstack_model"
            )
        async with received_body(request) as body:
            form = parse_form(body, request.headers.get("Content-Type"))
        if over_tcp(request):
            token = presented_token(request.headers.get("Authorization")) or form.get("api_key")
            problem = scope_problem(token or None, False, settings)
            if problem is not None:
                return _deepstack_error(*problem)
        if "image" not in form:
            raise InvalidInput("the form has no 'image' field")
        raw = form.get("min_confidence")
        min_score = _score(raw.decode("ascii", "replace") if raw else None, "min_confidence")
        answer = await request.app[DATAPLANE].detect(
            settings.deepstack_model, None, form["image"], min_score
        )
    except ServingError as exc:
        return _deepstack_error(exc.status, exc.message)
    predictions: list[dict[str, Any]] = [
        {
            "label": found["label"],
            "confidence": found["score"],
            "x_min": round(found["box"][0]),
            "y_min": round(found["box"][1]),
            "x_max": round(found["box"][2]),
            "y_max": round(found["box"][3]),
        }
        for found in answer["detections"]
    ]
    duration = round(time.perf_counter() - started, 6)
    return web.json_response({"success": True, "predictions": predictions, "duration": duration})


def detect_routes() -> list[web.RouteDef]:
    return [
        web.post("/v1/models/{name}/detect", detect_image),
        web.post("/v1/vision/detection", deepstack_detection),
    ]
