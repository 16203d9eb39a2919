"""The dashboard's deployment pages: the list with a form that creates one, and one deployment.

A deployment page shows what an operator needs to judge a rollout: the policy (stages, abort
threshold, minimum finished, stage time-out), per stage its counts and when it started and
ended, per device its status with when it was sent and when it answered. ``?only=failures``
keeps the failed and timed-out devices. A device an ended deployment never sent (still
``queued``, or a status such as ``not_sent``) is shown as "not sent", never as waiting; a
status this dashboard does not know is shown as it is.

Actions (admins; the server checks the scope, the page's CSRF token goes with each) call the
REST API from the page's script: pause/resume/abort, roll back to another stored version of the
model, and retry — a new deployment of the same release and policy to the devices that failed
or timed out. A read-only session gets no buttons and no create form, only a line saying that
acting needs an admin token.

The page reads the change version *before* the deployment (``Changes.snapshot``), so a change
committed while the page is being built makes its first long poll answer at once.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from edgeagent.hub.server import deploydb, deployreads, releasedb
from edgeagent.hub.server.auth import csrf_token, may_change
from edgeagent.hub.server.context import context_of, query_page
from edgeagent.hub.server.dashboard import deployment_queries
from edgeagent.hub.server.dashboard.markup import escape, next_page, page, table, when
from edgeagent.hub.server.dashboard.scripts import CREATE, DEPLOYMENT, page_script
from edgeagent.hub.server.deploydb import ACTIVE, MOVES

STATUS_NAMES = {"timed_out": "timed out", "not_sent": "not sent"}
STATUS_CLASS = {"succeeded": "ok", "failed": "bad", "timed_out": "bad"}
POLICY_FIELDS = ("stages_pct", "abort_threshold_pct", "min_executed", "stage_timeout_s")
READ_ONLY = (
    "<p class='muted' id='read-only'>Signed in with a read-only token: {what} needs an admin "
    "token (<a href='/login'>sign in again</a>).</p>"
)


def status_label(status: str, active: bool) -> str:
    """What a device's row says: an ended deployment's queued device was never sent."""
    if status == "queued" and not active:
        return "not sent"
    if status == "sent" and not active:
        return "sent, no answer"
    return STATUS_NAMES.get(status, status)


def _status_cell(status: str, active: bool) -> str:
    """Succeeded green, failures red; never sent, unanswered or unknown statuses muted."""
    label = status_label(status, active)
    plain = label == status and status in deploydb.DEVICE_STATUSES
    css = STATUS_CLASS.get(status, "" if plain else "muted")
    return f"<span class='{css}'>{escape(label)}</span>" if css else escape(label)


# ---- the list and the create form ---------------------------------------------------------


def _create_form(releases: list[dict[str, Any]]) -> str:
    if not releases:
        return "<p class='muted'>Upload a release (POST /api/v1/releases) to deploy it.</p>"
    options = "".join(
        f"<option value='{r['id']}'>{escape(r['model'])} {escape(r['version'])} "
        f"(release {r['id']})</option>"
        for r in releases
    )
    inputs = (
        ("group", "group", "lab"),
        ("devices", "devices (optional)", "dev-001, dev-002"),
        ("stages", "stages %", "5, 25, 100"),
        ("threshold", "abort at failed %", "20"),
        ("min", "min finished", "1"),
        ("timeout", "stage time-out s", "600"),
    )
    fields = "".join(
        f"<label>{escape(label)}<input id='new-{name}' placeholder='{escape(hint)}'></label>"
        for name, label, hint in inputs
    )
    return (
        "<fieldset id='create-form'><legend>New deployment</legend>"
        f"<label>release<select id='new-release'>{options}</select></label>{fields}"
        "<button id='create'>Create</button></fieldset>"
    )


async def deployments_page(request: web.Request) -> web.Response:
    hub = context_of(request)
    async with hub.engine.connect() as connection:
        rows = await deployreads.list_deployments(
            connection, limit=hub.settings.page_size, offset=0
        )
        releases = (await releasedb.list_releases(connection))[: hub.settings.page_size]
    listing = table(
        ["Deployment", "Model", "Group", "State", "Stage", "Created", "Reason"],
        [
            [
                f"<a href='/ui/deployments/{escape(d['id'])}'>{escape(d['id'])}</a>",
                escape(d["model"]),
                escape(d["group"]),
                escape(d["state"]),
                escape(f"{d['stage']}/{d['stage_count']}"),
                escape(when(d["created_at"])),
                escape(d["reason"]),
            ]
            for d in rows
        ],
        "deployments",
    )
    if may_change(request):
        body = _create_form(releases) + "<p id='message'></p>" + listing
    else:
        body = READ_ONLY.format(what="creating a deployment") + "<p id='message'></p>" + listing
    script = page_script({"csrf": csrf_token(request)}, CREATE)
    return page("Deployments", body, script)


# ---- one deployment ------------------------------------------------------------------------


def _policy_line(found: dict[str, Any]) -> str:
    stages = " → ".join(f"{p:g} %" for p in found["stages_pct"])
    return (
        f"<p id='policy'>Stages {escape(stages)}; abort when at least "
        f"{found['abort_threshold_pct']:g} % of the finished devices failed (once "
        f"{found['min_executed']} finished); stage time-out {found['stage_timeout_s']:g} s</p>"
    )


def _stage_counts(
    stage: dict[str, Any], times: deployment_queries.StageTimes | None, active: bool
) -> tuple[int, int]:
    """(waiting, not sent) of one stage: a queued device waits only while the deployment
    runs; ``not_sent`` rows, and rows of a status this hub does not count (a newer hub's),
    were never sent; ``cancelled`` ones were, but refused it, so neither installed it."""
    known = sum(stage[s] for s in deploydb.DEVICE_STATUSES)
    unknown = (times.devices if times else known) - known
    waiting = stage["sent"] + (stage["queued"] if active else 0)
    never = stage[deploydb.NOT_SENT] + stage[deploydb.CANCELLED]  # neither installed it
    return waiting, never + unknown + (0 if active else stage["queued"])


def _progress(parts: list[tuple[str, int]], total: int, width: int = 200) -> str:
    """The stage's devices as one SVG bar (no inline style: see the CSP)."""
    bars, x = [], 0.0
    for kind, n in parts:
        if n:
            share = width * n / (total or 1)
            bars.append(f"<rect class='bar {kind}' x='{x:.0f}' width='{share:.0f}' height='10'/>")
            x += share
    return f"<svg width='{width}' height='10'>{''.join(bars)}</svg>"


def _stages_table(found: dict[str, Any], times: dict[int, Any], active: bool) -> str:
    rows = []
    for s in found["stages"]:
        spans = times.get(s["stage"])
        waiting, not_sent = _stage_counts(s, spans, active)
        failed = s["failed"] + s["timed_out"]
        total = s["succeeded"] + failed + waiting + not_sent
        parts = [("", s["succeeded"]), ("fail", failed), ("wait", waiting), ("none", not_sent)]
        rows.append(
            [
                str(s["stage"]),
                str(total),
                str(s["succeeded"]),
                str(s["failed"]),
                str(s["timed_out"]),
                str(waiting),
                str(not_sent),
                escape(when(spans.started if spans else None)),
                escape(when(spans.ended if spans else None)),
                _progress(parts, total),
            ]
        )
    headers = ["Stage", "Devices", "Succeeded", "Failed", "Timed out", "Waiting", "Not sent"]
    return table([*headers, "Started", "Ended", "Progress"], rows, "stages")


def _actions(found: dict[str, Any], versions: list[str], failed: list[str]) -> str:
    state = found["state"]
    html_ = ""
    if state in ACTIVE:
        html_ += "".join(
            f"<button data-action='{a}'>{a.title()}</button>" for a in ("pause", "resume", "abort")
        )
    if state in MOVES["rollback"][0] and versions:
        options = "".join(f"<option>{escape(v)}</option>" for v in versions)
        html_ += (
            f"<label>roll back to <select id='rollback-version'>{options}</select></label>"
            "<button id='rollback'>Roll back</button>"
        )
    if state not in ACTIVE and failed:
        html_ += f"<button id='retry'>Retry the {len(failed)} failed device(s)</button>"
    return f"<p id='actions'>{html_}</p><p id='message'></p>"


def _retry_body(found: dict[str, Any], failed: list[str]) -> dict[str, Any]:
    """The same release and policy, to the devices that failed or timed out."""
    policy = {k: found[k] for k in POLICY_FIELDS}
    return {"release_id": found["release_id"], "group": found["group"], "devices": failed, **policy}


def _filter_links(deployment_id: str, failures_only: bool) -> str:
    path = f"/ui/deployments/{escape(deployment_id)}"
    both = (("all", path, "all devices"), ("failures", f"{path}?only=failures", "failures only"))
    links = [
        f"<b>{label}</b>"
        if (key == "failures") == failures_only
        else f"<a id='show-{key}' href='{href}'>{label}</a>"
        for key, href, label in both
    ]
    return f"<p id='filter'>Show: {' · '.join(links)}</p>"


async def deployment_page(request: web.Request) -> web.Response:
    hub = context_of(request)
    deployment_id = request.match_info["deployment_id"]
    limit, offset = query_page(request)
    failures_only = request.query.get("only", "") == "failures"

    async def read() -> dict[str, Any] | None:
        async with hub.engine.connect() as connection:
            found = await deployreads.get_deployment(connection, deployment_id, device_limit=0)
            if found is None:
                return None
            rows, shown = await deployment_queries.device_rows(
                connection, deployment_id, failures_only=failures_only, limit=limit, offset=offset
            )
            model = found["release"]["model"] if found["release"] else found["model"]
            releases = await releasedb.list_releases(connection, model)
            return {
                "found": found,
                "rows": rows,
                "shown": shown,
                "times": await deployment_queries.stage_times(connection, deployment_id),
                "failed": await deployment_queries.failed_devices(connection, deployment_id),
                "versions": sorted({r["version"] for r in releases}),
            }

    version, got = await hub.changes.snapshot(read)
    if got is None:
        return page("Not found", f"<p>No deployment {escape(deployment_id)}.</p>", status=404)
    found, active = got["found"], got["found"]["state"] in ACTIVE
    release = found["release"] or {}
    head = (
        f"<p id='state'>State <b>{escape(found['state'])}</b>, stage {found['stage']} of "
        f"{found['stage_count']} — {escape(release.get('model'))} "
        f"{escape(release.get('version'))} to group {escape(found['group'] or '-')}</p>"
    )
    if found["reason"]:
        head += f"<p class='bad' id='reason'>{escape(found['reason'])}</p>"
    if found.get("rollback_of"):
        rolled = escape(found["rollback_of"])
        head += (
            f"<p id='rollback-of'>Rolls back <a href='/ui/deployments/{rolled}'>{rolled}</a></p>"
        )
    versions = [v for v in got["versions"] if v != release.get("version")]
    head += _policy_line(found)
    if may_change(request):
        head += _actions(found, versions, got["failed"])
    else:
        # no buttons, but the live refresh still says here when the hub does not answer
        head += READ_ONLY.format(what="acting on this deployment") + "<p id='message'></p>"
    devices = table(
        ["Device", "Stage", "Status", "Result", "Code", "Message", "Sent", "Answered"],
        [
            [
                f"<a href='/ui/devices/{escape(d['device_id'])}'>{escape(d['device_id'])}</a>",
                str(d["stage"]),
                _status_cell(d["status"], active),
                escape(d["result"]),
                escape(d["code"]),
                escape(d["message"]),
                escape(when(d["sent_at"])),
                escape(when(d["answered_at"])),
            ]
            for d in got["rows"]
        ],
        "outcomes",
    )
    shown_rows = (
        f"<p class='muted' id='shown'>devices {min(offset + 1, got['shown'])}–"
        f"{offset + len(got['rows'])} of {got['shown']}"
        f"{' failed or timed out' if failures_only else ''}</p>"
    )
    pager = next_page(f"/ui/deployments/{deployment_id}", request, limit, offset, got["shown"])
    data = {
        "id": deployment_id,
        "seen": version,
        "shown": _progress_key(found),
        "csrf": csrf_token(request),
        "live": active,
        "retry": _retry_body(found, got["failed"]),
    }
    body = (
        head
        + _stages_table(found, got["times"], active)
        + _filter_links(deployment_id, failures_only)
        + shown_rows
        + devices
        + pager
    )
    return page(f"Deployment {deployment_id}", body, page_script(data, DEPLOYMENT))


def _progress_key(found: dict[str, Any]) -> str:
    """What the script compares each poll's answer with: ``JSON.stringify([state, stage,
    totals])`` of the API's answer, byte for byte (no spaces, the same key order)."""
    return json.dumps([found["state"], found["stage"], found["totals"]], separators=(",", ":"))
