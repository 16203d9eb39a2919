"""Every input of the hub's REST API — its query and path parameters and its JSON bodies — as
schemas of ``inputs``, which checks each request against them and writes them into the OpenAPI
document.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from edgeagent.fleet.windows import MAX_SCHEDULE_CHARS
from edgeagent.hub.policy import StagedPolicy
from edgeagent.hub.policy.staged import MAX_MIN_EXECUTED
from edgeagent.hub.server import deploydb
from edgeagent.hub.server.inputs import (
    INT4_MAX,
    Param,
    Schema,
    array,
    choice,
    integer,
    number,
    obj,
    text,
)
from edgeagent.hub.server.schema import deployments, devices, releases
from edgeagent.hub.server.settings import ServerSettings

# Lengths are the columns' (schema.py): a longer id or filter can match nothing.


def _length(column: sa.Column[Any]) -> int:
    length = getattr(column.type, "length", None)
    assert isinstance(length, int), column
    return length


_ID = _length(devices.c.device_id)
_GROUP = _length(devices.c.group_name)
_PROFILE = _length(devices.c.profile)
_MODEL = _length(releases.c.model)
_VERSION = _length(releases.c.version)
_GOVERNOR = _length(devices.c.governor_state)
_DEPLOYMENT = _length(deployments.c.id)

LIMIT = Param(
    "limit",
    "query",
    lambda s: integer(1, s.max_page_size, "page size (at most --max-page-size)", s.page_size),
)
OFFSET = Param("offset", "query", integer(0, 10**9, "rows to skip", 0))
WAIT = Param(
    "wait", "query", lambda s: number(0, s.max_wait_s, "long poll, seconds (at most --max-wait)")
)
AFTER = Param(
    "after", "query", integer(0, 2**62, "with wait: the version seen; answers once it moved")
)
GROUP = Param("group", "query", text(_GROUP))
MODEL = Param("model", "query", text(_MODEL))
VERSION = Param("version", "query", text(_VERSION, "the active version of ?model="))
PROFILE = Param("profile", "query", text(_PROFILE))
AVAILABILITY = Param("availability", "query", choice(["", "online", "offline", "unknown"]))
GOVERNOR_STATE = Param("governor_state", "query", text(_GOVERNOR))
FILTERS = (GROUP, MODEL, VERSION, PROFILE, AVAILABILITY, GOVERNOR_STATE)
KIND = Param("kind", "query", choice(["", "event", "state", "availability"]))
BEFORE = Param("before", "query", number(0, 1e12, "Unix time: older entries only", 1e12))
STATE = Param("state", "query", choice(["", *deploydb.STATES]))

DEVICE_ID = Param("device_id", "path", text(_ID, min_length=1))
RELEASE_ID = Param(
    "release_id", "path", integer(1, INT4_MAX, "as POST /api/v1/releases answered it")
)
DEPLOYMENT_ID = Param("deployment_id", "path", text(_DEPLOYMENT, min_length=1))
ACTION = Param("action", "path", choice(["pause", "resume", "abort"]))


def _policy_fields(settings: ServerSettings) -> dict[str, Schema]:
    """The staged policy's parameters, with ``hub/policy/staged.py``'s bounds and defaults."""
    defaults = StagedPolicy()
    return {
        "stages_pct": array(
            number(0, 100, above=True),
            settings.max_stages,
            "cumulative percentages, increasing, the last 100 (at most --max-stages)",
            min_items=1,
        ),
        "abort_threshold_pct": number(
            0, 100, "failed share that aborts", defaults.abort_threshold_pct, above=True
        ),
        "min_executed": integer(
            1,
            MAX_MIN_EXECUTED,
            "finished devices before the abort criterion applies",
            defaults.min_executed,
        ),
        "stage_timeout_s": number(
            0,
            settings.max_wait_s,
            f"in-progress time-out per stage (default {defaults.stage_timeout_s:g} s or "
            "--max-wait, whichever is shorter)",
            above=True,
        ),
    }


def new_deployment(settings: ServerSettings) -> Schema:
    return obj(
        {
            "release_id": integer(1, INT4_MAX, "the release; or name it by model and version"),
            "model": text(_MODEL, min_length=1),
            "version": text(_VERSION, min_length=1),
            "group": text(_GROUP, "devices of this group"),
            "devices": array(
                text(_ID, min_length=1), settings.max_device_ids, "these devices (--max-device-ids)"
            ),
            "profile": text(_PROFILE, "only devices of this hardware profile"),
            **_policy_fields(settings),
            "stage_windows": array(
                obj(
                    {
                        "stage": integer(1, settings.max_stages, "the stage, from 1"),
                        "schedule": text(
                            MAX_SCHEDULE_CHARS, "e.g. 'Mon-Fri 02:00-04:00; Sat,Sun 00:00-06:00'"
                        ),
                        "timezone": text(64, "an IANA zone; absent: each device's own"),
                    },
                    required=["stage", "schedule"],
                ),
                settings.max_stages,
                "a maintenance window per stage, signed into that stage's envelopes "
                "(the server needs --release-key); a stage without one: the release's",
            ),
        },
        "a staged deployment: name the release ('release_id', or 'model' and 'version')",
    )


def rollback(settings: ServerSettings) -> Schema:
    return obj(
        {
            "version": text(_VERSION, "the version to go back to", min_length=1),
            **_policy_fields(settings),
        },
        required=["version"],
    )


ACTION_BODY = obj({"reason": text(None, "why (shown with the deployment)")})
ENVELOPE = {
    "type": "object",
    "description": "a *.release.json (or *.agent-release.json) exactly as `hub sign` wrote it; "
    "checked as a device would",
}
