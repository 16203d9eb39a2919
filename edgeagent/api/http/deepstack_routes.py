"""DeepStack's and CodeProject.AI's vision API, served by the agent's detectors.

Frigate's ``deepstack`` detector, Home Assistant's ``deepstack_object`` (through
``deepstack-python``), ``deepstack-sdk`` and Blue Iris post a camera frame to a local "AI
server" as ``multipart/form-data``: an ``image`` field, optional ``min_confidence`` and the
token in an ``api_key`` field. Pointed at the agent they get its accelerator choice, governor
and signed updates with no change on their side:

- ``POST /v1/vision/detection`` — the detector ``[server] deepstack_model`` names;
- ``POST /v1/vision/custom/{model}`` — any served detector by name (DeepStack's custom
  models, Home Assistant's ``custom_model``, the SDK's ``Detection(name=…)``);
- ``POST /v1/vision/custom/list`` — the served detectors (CodeProject.AI's model list).

The answers keep DeepStack's shape (``success`` on every answer, ``predictions`` best first,
``duration``; "Incorrect api key"; 403 "… endpoint not activated") with CodeProject.AI's extra
fields (``message``, ``count``, ``inferenceMs``, ``processMs``, ``moduleId``, errors' ``code``).
``min_confidence`` defaults to DeepStack's 0.40 and may go below the package's threshold.

These are the only routes the browser guard lets a multipart body through (``listener_guard``):
they take the token from the form, and a page on another origin cannot know it (nor send its
``Origin`` past the guard).
"""

from __future__ import annotations

import email.parser
import email.policy
import time
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

from edgeagent.api.auth import form_credentials, over_tcp, presented_token, scope_problem
from edgeagent.api.http.app_keys import DATAPLANE, SETTINGS
from edgeagent.api.http.body import received_body
from edgeagent.api.http.detect_routes import score_field
from edgeagent.api.settings import ServerSettings
from edgeagent.engine.dataplane import DataPlane
from edgeagent.engine.errors import InvalidInput, ServingError
from edgeagent.models.package import PackageError, load_package

MAX_FORM_PARTS = 8  # image, min_confidence, api_key and a few a client may add
DEFAULT_MIN_CONFIDENCE = 0.40  # DeepStack's own default when the field is absent
MODULE_ID = "edgeagent"  # CodeProject.AI names the module that answered
URLENCODED = "application/x-www-form-urlencoded"
FORM_TYPES = ("multipart/form-data", URLENCODED)  # what the browser guard lets these routes take


class DeepStackError(Exception):
    """An answer in DeepStack's error shape: the status and the message clients show."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


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


def parse_fields(body: bytes, content_type: str | None) -> dict[str, bytes]:
    """A form in either encoding a client may use for a request without an image (the model
    list): ``multipart/form-data`` or ``application/x-www-form-urlencoded``; none when empty."""
    if not body:
        return {}
    if content_type and content_type.lower().startswith(URLENCODED):
        try:
            pairs = urllib.parse.parse_qsl(
                body.decode("ascii"), strict_parsing=True, max_num_fields=MAX_FORM_PARTS
            )
        except (UnicodeDecodeError, ValueError) as exc:
            raise InvalidInput(f"the urlencoded form is malformed: {exc}") from None
        return {key: value.encode() for key, value in pairs}
    return parse_form(body, content_type)


def error_body(status: int, message: str) -> dict[str, Any]:
    """DeepStack's error shape plus CodeProject.AI's ``code``."""
    return {"success": False, "error": message, "code": status, "duration": 0}


def _error(status: int, message: str) -> web.Response:
    return web.json_response(error_body(status, message), status=status)


def check_token(request: web.Request, form: Mapping[str, bytes], settings: ServerSettings) -> None:
    """The user scope over TCP, from ``Authorization: Bearer`` or the form's ``api_key``, with
    the messages DeepStack clients show their users."""
    if not over_tcp(request):
        return
    token = presented_token(request.headers.get("Authorization")) or form.get("api_key") or None
    problem = scope_problem(token, False, settings)
    if problem is None:
        return
    if not settings.token:  # the agent's own reason: no token configured at all
        raise DeepStackError(*problem)
    if token is None:
        raise DeepStackError(
            401, "missing api_key: send [server] token in the form's api_key field"
        )
    raise DeepStackError(401, "Incorrect api key")


def served_detectors(dataplane: DataPlane) -> list[str]:
    """The ready models that can answer a DeepStack request (``[detection]`` + ``[preprocess]``)."""
    found = []
    for entry in dataplane.repository_index(ready_only=True):
        package = dataplane.model(entry["name"]).package
        if package.detection is not None and package.preprocess is not None:
            found.append(entry["name"])
    return sorted(set(found))


def _loading(dataplane: DataPlane, name: str) -> bool:
    """A model of that name is known but not ready (loading, swapping): the dataplane's own
    answer (503, retry) is right for it, not "not activated" or "not served"."""
    ready = {e["name"] for e in dataplane.repository_index(ready_only=True)}
    return name not in ready and any(e["name"] == name for e in dataplane.repository_index())


def _detector(request: web.Request, name: str) -> str:
    """``name`` if it is a served detector (or one still loading), else DeepStack's refusal."""
    dataplane = request.app[DATAPLANE]
    detectors = served_detectors(dataplane)
    if name in detectors or _loading(dataplane, name):
        return name
    served = ", ".join(detectors) or "none"
    raise DeepStackError(404, f"custom model {name!r} is not served (detectors: {served})")


def _predictions(answer: dict[str, Any], limit: int) -> list[dict[str, Any]]:
    """The dataplane's detections (already best first) as DeepStack's integer-pixel boxes."""
    return [
        {
            "label": found["label"],
            "confidence": found["score"],
            "x_min": round(found["box"][0]),
            "y_min": round(found["box"][1]),
            "x_max": round(found["box"][2]),
            "y_max": round(found["box"][3]),
        }
        for found in answer["detections"][:limit]
    ]


def _message(predictions: list[dict[str, Any]]) -> str:
    labels = sorted({p["label"] for p in predictions})
    return f"Found {', '.join(labels)}" if labels else "No objects found"


async def _detect(request: web.Request, model: str | None) -> web.Response:
    """One frame through ``model`` (None: ``[server] deepstack_model``), in DeepStack's shape."""
    started = time.perf_counter()
    settings = request.app[SETTINGS]
    try:
        async with received_body(request) as body:
            form = parse_form(body, request.headers.get("Content-Type"))
        check_token(request, form, settings)
        if model is None:
            if not settings.deepstack_model:
                raise DeepStackError(
                    403,
                    "Detection endpoint not activated: set [server] deepstack_model to a "
                    "served detector",
                )
            model = settings.deepstack_model
            dataplane = request.app[DATAPLANE]
            if model not in served_detectors(dataplane) and not _loading(dataplane, model):
                raise DeepStackError(
                    403,
                    f"Detection endpoint not activated: [server] deepstack_model {model!r} is "
                    "not a served detector",
                )
        else:
            model = _detector(request, model)
        if "image" not in form:
            raise InvalidInput("the form has no 'image' field")
        raw = form.get("min_confidence")
        given = score_field(raw.decode("ascii", "replace") if raw else None, "min_confidence")
        min_score = DEFAULT_MIN_CONFIDENCE if given is None else given
        answer = await request.app[DATAPLANE].detect(model, None, form["image"], min_score)
    except (DeepStackError, ServingError) as exc:
        return _error(exc.status, exc.message)
    predictions = _predictions(answer, settings.deepstack_max_predictions)
    elapsed = time.perf_counter() - started
    return web.json_response(
        {
            "success": True,
            "predictions": predictions,
            "duration": round(elapsed, 6),
            "message": _message(predictions),
            "count": len(predictions),
            "inferenceMs": round(answer["latency_ms"]),
            "processMs": round(elapsed * 1000.0),
            "moduleId": MODULE_ID,
            "command": "detect" if model == settings.deepstack_model else "custom",
            "executionProvider": f"{answer['backend']}/{answer['device']}",
        }
    )


@form_credentials
async def deepstack_detection(request: web.Request) -> web.Response:
    """DeepStack's ``POST /v1/vision/detection``, served by ``[server] deepstack_model``."""
    return await _detect(request, None)


@form_credentials
async def deepstack_custom(request: web.Request) -> web.Response:
    """DeepStack's ``POST /v1/vision/custom/{model}``: any served detector by name."""
    return await _detect(request, request.match_info["model"])


@form_credentials
async def deepstack_custom_list(request: web.Request) -> web.Response:
    """CodeProject.AI's ``POST /v1/vision/custom/list``: the detectors a client may name."""
    settings = request.app[SETTINGS]
    try:
        async with received_body(request) as body:
            form = parse_fields(body, request.headers.get("Content-Type"))
        check_token(request, form, settings)
    except (DeepStackError, ServingError) as exc:
        return _error(exc.status, exc.message)
    models = served_detectors(request.app[DATAPLANE])
    return web.json_response(
        {
            "success": True,
            "models": models,
            "message": f"{len(models)} model(s)",
            "count": len(models),
            "moduleId": MODULE_ID,
            "command": "list",
        }
    )


def deepstack_model_problem(name: str, packages: list[Path]) -> str | None:
    """Why ``[server] deepstack_model`` cannot answer (no such package, not a detector), for
    ``config check`` and the daemon's start; None when it can."""
    if not name:
        return None
    found = {}
    for directory in packages:
        try:
            package = load_package(directory)
        except PackageError:
            continue  # its own load reports it
        found[package.name] = package
    if name not in found:
        known = ", ".join(sorted(found)) or "none"
        return f"[server] deepstack_model: no model {name!r} is served (packages: {known})"
    package = found[name]
    if package.detection is None or package.preprocess is None:
        return (
            f"[server] deepstack_model: {name!r} is a {package.task} model, not a detector with "
            "[detection] and [preprocess] sections"
        )
    return None


def deepstack_routes() -> list[web.RouteDef]:
    return [
        web.post("/v1/vision/detection", deepstack_detection),
        web.post("/v1/vision/custom/list", deepstack_custom_list),
        web.post("/v1/vision/custom/{model}", deepstack_custom),
    ]
