"""``/v1/update-lock``: a local app defers model swaps and self-updates while it works.

``POST`` takes (or renews) the caller's lock: ``{"holder": "scale-app", "hold_s": 300,
"reason": "weighing"}``; ``hold_s`` may not exceed ``[updates] max_lock_hold_s`` (400 if it
does) and a lock never outlives that maximum from its first take. ``DELETE
/v1/update-lock?holder=NAME`` releases it (404 when that holder holds none); ``GET`` lists the
holders. The semantics and the gate they feed are ``updates.locks``'; like every route, over
TCP these need the API token, over the Unix socket the socket's permissions decide.
"""

from __future__ import annotations

import math
import re
from typing import Any

from aiohttp import web

from edgeagent.api.http.app_keys import UPDATE_LOCKS
from edgeagent.api.http.body import read_json_object
from edgeagent.engine.errors import InvalidInput, ServingError
from edgeagent.updates.locks import LockError, TooManyLocks, UpdateLocks

HOLDER_RE = re.compile(r"\A[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}\Z", re.ASCII)
MAX_REASON_CHARS = 200


class LockConflict(ServingError):
    status = 409


def _holder(value: Any) -> str:
    if not isinstance(value, str) or not HOLDER_RE.match(value):
        raise InvalidInput(
            "holder must be 1-64 letters, digits, '_', '.', ':' or '-', starting with a letter "
            "or digit"
        )
    return value


def _locks(request: web.Request) -> UpdateLocks:
    return request.app[UPDATE_LOCKS]


def _answer(locks: UpdateLocks) -> dict[str, Any]:
    return {"locks": locks.holders(), "max_hold_s": locks.max_hold_s}


async def take_lock(request: web.Request) -> web.Response:
    body = await read_json_object(request)
    unknown = sorted(set(body) - {"holder", "hold_s", "reason"})
    if unknown:
        raise InvalidInput(f"unknown field(s) {', '.join(unknown)}")
    holder = _holder(body.get("holder"))
    hold_s = body.get("hold_s")
    if (
        not isinstance(hold_s, (int, float))
        or isinstance(hold_s, bool)
        or not math.isfinite(hold_s)
    ):
        raise InvalidInput("hold_s must be a number of seconds")
    reason = body.get("reason", "")
    if not isinstance(reason, str) or len(reason) > MAX_REASON_CHARS:
        raise InvalidInput(f"reason must be a string of at most {MAX_REASON_CHARS} characters")
    locks = _locks(request)
    try:
        lock = locks.hold(holder, float(hold_s), reason)
    except TooManyLocks as exc:
        raise LockConflict(str(exc)) from exc
    except LockError as exc:
        raise InvalidInput(str(exc)) from exc
    return web.json_response({"lock": lock.to_dict(locks.clock()), **_answer(locks)})


async def release_lock(request: web.Request) -> web.Response:
    holder = _holder(request.query.get("holder"))
    locks = _locks(request)
    if not locks.release(holder):
        raise web.HTTPNotFound(reason=f"{holder} holds no update lock")
    return web.json_response({"released": holder, **_answer(locks)})


async def show_locks(request: web.Request) -> web.Response:
    return web.json_response(_answer(_locks(request)))


def lock_routes() -> list[web.RouteDef]:
    return [
        web.get("/v1/update-lock", show_locks),
        web.post("/v1/update-lock", take_lock),
        web.delete("/v1/update-lock", release_lock),
    ]
