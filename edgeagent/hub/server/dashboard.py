"""The dashboard: server-rendered pages over the same queries as the REST API, no build step.

- ``/`` — the fleet table: counts at the top, filters (group, model, version, availability,
  governor state) as a plain GET form, pages of ``--page-size`` devices;
- ``/ui/devices/{id}`` — models, versions and backends, governor and temperatures, a
  temperature chart (inline SVG drawn here from the state history), the event history;
- ``/ui/deployments`` and ``/ui/deployments/{id}`` — stage progress, every device's outcome
  and code, the abort reason, pause/resume/abort buttons for admins; the page long-polls the
  JSON API and redraws itself when the deployment changes.

A browser authenticates with the same tokens as the API: ``/login`` checks the token and keeps
it in an HttpOnly, SameSite=Strict cookie. The buttons send the page's CSRF token with each
action (``auth.csrf_token``), because a page on another port of this host is the same site and
gets the cookie sent too. Each page allows only its own script and style (a nonce in its
Content-Security-Policy), so there are no inline ``style=`` or ``onclick=`` attributes.
"""

from __future__ import annotations

import html
import json
import secrets
from typing import Any
from urllib.parse import urlencode

from aiohttp import web

from edgeagent.httpguard import accepts_forms, page_policy
from edgeagent.hub.server import deploydb, fleetdb
from edgeagent.hub.server.auth import TOKENS, csrf_token, sign_in
from edgeagent.hub.server.context import context_of, query_filter, query_page
from edgeagent.hub.server.deploydb import ACTIVE

STYLE = """
body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:.5em 0}td,th{border-bottom:1px solid #ddd;padding:3px 8px;
text-align:left}th{background:#f4f4f4}.counts span{margin-right:1.5em;font-weight:600}
.ok{color:#17803d}.bad{color:#b3261e}.muted{color:#777}form.filters input,form.filters select
{margin-right:.5em}.bar{fill:#17803d}.bar.fail{fill:#b3261e}.bar.wait{fill:#ccc}
button{margin-right:.5em}#temperature{border:1px solid #ddd}
"""


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def _page(title: str, body: str, script: str = "", status: int = 200) -> web.Response:
    """A whole page; its style and script run by this answer's nonce, nothing else does."""
    nonce = secrets.token_urlsafe(16)
    document = (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{_e(title)} · edgeagent hub"
        f"</title><style nonce='{nonce}'>{STYLE}</style></head><body><nav><a href='/'>Fleet</a>"
        f" · <a href='/ui/deployments'>Deployments</a></nav><h1>{_e(title)}</h1>{body}"
        f"{f'<script nonce={nonce!r}>{script}</script>' if script else ''}</body></html>"
    )
    return web.Response(
        text=document,
        content_type="text/html",
        status=status,
        headers={"Content-Security-Policy": page_policy(nonce)},
    )


def _table(headers: list[str], rows: list[list[str]], table_id: str = "") -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    ident = f" id='{table_id}'" if table_id else ""
    return f"<table{ident}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


async def fleet_page(request: web.Request) -> web.Response:
    hub = context_of(request)
    where = query_filter(request)
    limit, offset = query_page(request)
    async with hub.engine.connect() as connection:
        found = await fleetdb.list_devices(connection, where, limit=limit, offset=offset)
    counts = found["counts"]
    summary = (
        f"<p class='counts' id='counts'><span>{found['total']} devices</span>"
        f"<span class='ok'>{counts.get('online', 0)} online</span>"
        f"<span class='bad'>{counts.get('offline', 0)} offline</span>"
        f"<span class='muted'>{counts.get('unknown', 0)} unknown</span></p>"
    )
    if not hub.ingest.synced.is_set():
        summary += "<p class='bad'>Still reading the broker's retained reports…</p>"
    fields = [
        (name, request.query.get(name, ""))
        for name in ("group", "model", "version", "profile", "governor_state")
    ]
    inputs = "".join(
        f"<input name='{n}' placeholder='{n.replace('_', ' ')}' value='{_e(v)}'>" for n, v in fields
    )
    chosen = request.query.get("availability", "")
    options = "".join(
        f"<option value='{v}'{' selected' if v == chosen else ''}>{v or 'any'}</option>"
        for v in ("", "online", "offline", "unknown")
    )
    form = (
        f"<form class='filters' method='get'>{inputs}<select name='availability'>{options}"
        "</select><button>Filter</button></form>"
    )
    rows = [
        [
            f"<a href='/ui/devices/{_e(d['device_id'])}'>{_e(d['device_id'])}</a>",
            _e(d["group"]),
            f"<span class='{'ok' if d['online'] else 'bad'}'>{_e(d['availability'])}</span>",
            _e(", ".join(f"{m} {v}" for m, v in d["models"].items()) or "-"),
            _e(d["profile"]),
            _e(d["governor_state"] or "-"),
            _e("-" if d["max_temp_c"] is None else f"{d['max_temp_c']:.1f} °C"),
            _e(f"{d['last_result']} {d['last_code']}".strip() or "-"),
            _e(f"{d['seen_s_ago']:.0f} s ago"),
        ]
        for d in found["devices"]
    ]
    headers = [
        "Device",
        "Group",
        "Availability",
        "Models",
        "Profile",
        "Governor",
        "Max temp",
        "Last update",
        "Seen",
    ]
    pager = _next_page("/", request, limit, offset, found["total"])
    return _page("Fleet", summary + form + _table(headers, rows, "fleet") + pager)


def _next_page(path: str, request: web.Request, limit: int, offset: int, total: int) -> str:
    """A link to the rows after this page (same filters), or nothing on the last page."""
    if offset + limit >= total:
        return ""
    query = {**request.query, "offset": str(offset + limit)}
    return f"<p><a id='next' href='{_e(path)}?{_e(urlencode(query))}'>next page →</a></p>"


def _chart(samples: list[tuple[float, float]], width: int = 600, height: int = 120) -> str:
    """Temperature over time as an SVG polyline (oldest left)."""
    if len(samples) < 2:
        return "<p class='muted'>Not enough temperature samples for a chart yet.</p>"
    times = [t for t, _ in samples]
    values = [v for _, v in samples]
    t0, t1 = min(times), max(times) or 1
    low, high = min(values) - 1, max(values) + 1
    span = (t1 - t0) or 1

    def point(t: float, v: float) -> str:
        return f"{(t - t0) / span * width:.1f},{height - (v - low) / (high - low) * height:.1f}"

    points = " ".join(point(t, v) for t, v in samples)
    return (
        f"<svg id='temperature' width='{width}' height='{height}'>"
        f"<polyline fill='none' stroke='#b3261e' stroke-width='2' points='{points}'/>"
        f"<text x='4' y='12' font-size='11'>{high:.0f} °C</text>"
        f"<text x='4' y='{height - 4}' font-size='11'>{low:.0f} °C</text></svg>"
    )


async def device_page(request: web.Request) -> web.Response:
    hub = context_of(request)
    device_id = request.match_info["device_id"]
    async with hub.engine.connect() as connection:
        device = await fleetdb.get_device(connection, device_id)
        if device is None:
            return _page("Not found", f"<p>No device {_e(device_id)}.</p>", status=404)
        history = await fleetdb.device_history(connection, device_id, limit=200)
    facts = _table(
        ["", ""],
        [
            ["Group", _e(device["group"])],
            ["Availability", _e(device["availability"])],
            ["Profile / board", _e(f"{device['profile']} / {device['board']}")],
            ["Agent", _e(device["agent_version"])],
            ["Governor", _e(device["governor_state"] or "-")],
            [
                "Temperatures",
                _e(", ".join(f"{k} {v:.1f} °C" for k, v in device["temperatures"].items()) or "-"),
            ],
            ["Power", _e("-" if device["power_w"] is None else f"{device['power_w']:.2f} W")],
        ],
    )
    models = _table(
        ["Model", "Version", "Runtime", "Device", "Precision"],
        [
            [
                _e(name),
                _e(version),
                *(
                    _e(device["backends"].get(name, {}).get(k, ""))
                    for k in ("runtime", "device", "precision")
                ),
            ]
            for name, version in device["models"].items()
        ],
        "models",
    )
    samples = [
        (e["at"], e["detail"]["max_temp_c"])
        for e in reversed(history)
        if e["kind"] == "state" and isinstance(e["detail"].get("max_temp_c"), (int, float))
    ]
    events = _table(
        ["At", "Kind", "Deployment", "Step", "Result", "Code"],
        [
            [
                _e(_when(e["at"])),
                _e(e["kind"]),
                _e(e["deployment_id"]),
                _e(e["step"]),
                _e(e["result"]),
                _e(e["code"]),
            ]
            for e in history
            if e["kind"] != "state"
        ],
        "history",
    )
    body = (
        facts
        + "<h2>Models</h2>"
        + models
        + "<h2>Temperature</h2>"
        + _chart(samples)
        + "<h2>History</h2>"
        + events
    )
    return _page(f"Device {device_id}", body)


def _when(at: float) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))


async def deployments_page(request: web.Request) -> web.Response:
    hub = context_of(request)
    async with hub.engine.connect() as connection:
        rows = await deploydb.list_deployments(connection, limit=hub.settings.page_size, offset=0)
    table = _table(
        ["Deployment", "Model", "Group", "State", "Stage", "Created", "Reason"],
        [
            [
                f"<a href='/ui/deployments/{_e(d['id'])}'>{_e(d['id'])}</a>",
                _e(d["model"]),
                _e(d["group"]),
                _e(d["state"]),
                _e(f"{d['stage']}/{d['stage_count']}"),
                _e(_when(d["created_at"])),
                _e(d["reason"]),
            ]
            for d in rows
        ],
        "deployments",
    )
    return _page("Deployments", table)


def _progress(stage: dict[str, Any], width: int = 200) -> str:
    """Succeeded, failed and waiting devices as one SVG bar (no inline style: see the CSP)."""
    total = stage["devices"] or 1
    parts = [
        ("", stage["succeeded"]),
        ("fail", stage["failed"] + stage["timed_out"]),
        ("wait", stage["sent"] + stage["queued"]),
    ]
    bars, x = [], 0.0
    for kind, n in parts:
        if n:
            bars.append(
                f"<rect class='bar {kind}' x='{x:.0f}' width='{width * n / total:.0f}' "
                "height='10'/>"
            )
            x += width * n / total
    return f"<svg width='{width}' height='10'>{''.join(bars)}</svg>"


# Long-polls the JSON API; redraws the page only when the deployment's progress changed (the
# change counter also moves for unrelated device reports). The buttons' actions carry the
# session's CSRF token.
LIVE = """
const id = %s; let seen = %d; const shown = %s; const csrf = %s;
const progress = (d) => JSON.stringify([d.state, d.stage, d.totals]);
async function follow() {
  for (;;) {
    const r = await fetch(`/api/v1/deployments/${id}?wait=25&after=${seen}`);
    if (!r.ok) return;
    const d = await r.json();
    seen = d.version;
    if (progress(d) !== shown) { location.reload(); return; }
  }
}
async function act(action) {
  const r = await fetch(`/api/v1/deployments/${id}/${action}`,
                        {method: 'POST', headers: {'X-CSRF-Token': csrf}});
  if (!r.ok) { alert((await r.json()).error); }
  location.reload();
}
for (const b of document.querySelectorAll('button[data-action]')) {
  b.addEventListener('click', () => act(b.dataset.action));
}
if (%s) follow();
"""


async def deployment_page(request: web.Request) -> web.Response:
    hub = context_of(request)
    deployment_id = request.match_info["deployment_id"]
    limit, offset = query_page(request)
    async with hub.engine.connect() as connection:
        found = await deploydb.get_deployment(
            connection, deployment_id, device_limit=limit, device_offset=offset
        )
    if found is None:
        return _page("Not found", f"<p>No deployment {_e(deployment_id)}.</p>", status=404)
    release = found["release"] or {}
    head = (
        f"<p id='state'>State <b>{_e(found['state'])}</b>, stage {found['stage']} of "
        f"{found['stage_count']} — {_e(release.get('model'))} {_e(release.get('version'))} "
        f"to group {_e(found['group'] or '-')}</p>"
    )
    if found["reason"]:
        head += f"<p class='bad' id='reason'>{_e(found['reason'])}</p>"
    if found["state"] in ACTIVE:
        head += "".join(
            f"<button data-action='{a}'>{a.title()}</button>" for a in ("pause", "resume", "abort")
        )
    stages = _table(
        ["Stage", "Devices", "Succeeded", "Failed", "Timed out", "Waiting", "Progress"],
        [
            [
                str(s["stage"]),
                str(s["devices"]),
                str(s["succeeded"]),
                str(s["failed"]),
                str(s["timed_out"]),
                str(s["sent"] + s["queued"]),
                _progress(s),
            ]
            for s in found["stages"]
        ],
        "stages",
    )
    devices = _table(
        ["Device", "Stage", "Status", "Result", "Code", "Message"],
        [
            [
                f"<a href='/ui/devices/{_e(d['device_id'])}'>{_e(d['device_id'])}</a>",
                str(d["stage"]),
                _e(d["status"]),
                _e(d["result"]),
                _e(d["code"]),
                _e(d["message"]),
            ]
            for d in found["devices"]
        ],
        "outcomes",
    )
    shown_rows = (
        f"<p class='muted' id='shown'>devices {min(offset + 1, found['device_count'])}–"
        f"{offset + len(found['devices'])} of {found['device_count']}</p>"
    )
    pager = _next_page(
        f"/ui/deployments/{deployment_id}", request, limit, offset, found["device_count"]
    )
    live = found["state"] in ACTIVE
    shown = json.dumps(
        json.dumps([found["state"], found["stage"], found["totals"]], separators=(",", ":"))
    )
    script = LIVE % (
        json.dumps(deployment_id),
        hub.changes.version,
        shown,
        json.dumps(csrf_token(request)),
        "true" if live else "false",
    )
    body = head + stages + shown_rows + devices + pager
    return _page(f"Deployment {deployment_id}", body, script)


SIGN_IN_FORM = (
    "<form method='post'><input type='password' name='token' placeholder='token' "
    "autofocus><button>Sign in</button></form>"
)


@accepts_forms  # the form carries the token itself, which a cross-site page cannot know
async def login_page(request: web.Request) -> web.Response:
    """Sign a browser in with a token it was given; ``--open`` needs no sign-in."""
    if request.method != "POST":
        return _page("Sign in", SIGN_IN_FORM)
    tokens = request.app[TOKENS]
    response = web.Response(status=303, headers={"Location": "/"})
    if tokens.open:
        return response
    token = (await request.post()).get("token", "")
    if not isinstance(token, str) or tokens.scope_of("", token) is None:
        return _page("Sign in", f"<p class='bad'>Unknown token.</p>{SIGN_IN_FORM}", status=401)
    sign_in(response, token)
    return response


def dashboard_routes() -> list[web.RouteDef]:
    return [
        web.get("/", fleet_page),
        web.get("/ui/devices/{device_id}", device_page),
        web.get("/ui/deployments", deployments_page),
        web.get("/ui/deployments/{deployment_id}", deployment_page),
        web.get("/login", login_page),
        web.post("/login", login_page),
    ]
