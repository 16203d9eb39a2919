"""The dashboard: server-rendered pages over the same queries as the REST API, no build step.

- ``/`` — the fleet table: counts at the top, filters (group, model, version, availability,
  governor state) as a plain GET form, pages of ``--page-size`` devices;
- ``/ui/devices/{id}`` — models, versions and backends with their latest throughput, error
  share and latency, governor and temperatures; charts of the newest ``--chart-points`` state
  reports (``charts``: the hottest sensor, and per model requests per second, failed
  requests and p50/p95 latency, taken from the reports' counters by ``traffic``); the event
  history;
- ``/ui/deployments`` and ``/ui/deployments/{id}`` — ``deployment_pages``: a form that
  creates a deployment, stage progress and times, the policy, every device's outcome, code and
  times (``?only=failures``), pause/resume/abort, rollback and retry for admins; the page
  long-polls the JSON API and redraws itself when the deployment changes, across hub restarts.

A browser authenticates with the same tokens as the API: ``/login`` checks the token and keeps
it in an HttpOnly, SameSite=Strict cookie. The buttons send the page's CSRF token with each
action (``auth.csrf_token``), because a page on another port of this host is the same site and
gets the cookie sent too. Each page allows only its own script and style (a nonce in its
Content-Security-Policy, ``markup.page``), so there are no inline ``style=`` or
``onclick=`` attributes.
"""

from __future__ import annotations

from aiohttp import web

from edgeagent.httpguard import accepts_forms
from edgeagent.hub.server import fleetdb
from edgeagent.hub.server.auth import TOKENS, sign_in
from edgeagent.hub.server.context import context_of, query_filter, query_page
from edgeagent.hub.server.dashboard.charts import PALETTE, Series, figure, line_chart
from edgeagent.hub.server.dashboard.deployment_pages import deployment_page, deployments_page
from edgeagent.hub.server.dashboard.markup import escape as _e
from edgeagent.hub.server.dashboard.markup import next_page as _next_page
from edgeagent.hub.server.dashboard.markup import page as _page
from edgeagent.hub.server.dashboard.markup import table as _table
from edgeagent.hub.server.dashboard.markup import when as _when
from edgeagent.hub.server.traffic import ModelSeries, model_series

TEMPERATURE = "#b3261e"  # the temperature line's colour: the dashboard's red for heat


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


def _traffic_charts(series: dict[str, ModelSeries]) -> str:
    """Throughput, error share and latency of every model, one line (colour) per model."""

    def lines(name: str, dashed: bool = False, suffix: str = "") -> list[Series]:
        return [
            Series(f"{model}{suffix}", getattr(found, name), PALETTE[i % len(PALETTE)], dashed)
            for i, (model, found) in enumerate(series.items())
        ]

    charts = (
        ("throughput", "Requests per second", lines("throughput"), "req/s"),
        ("errors", "Failed requests, % of requests", lines("error_pct"), "%"),
        (
            "latency",
            "Latency of the newest answers (p95 solid, p50 dashed)",
            lines("p95_ms", suffix=" p95") + lines("p50_ms", True, " p50"),
            "ms",
        ),
    )
    return "".join(
        f"<figure><figcaption>{_e(caption)}</figcaption>"
        f"{line_chart(chart_id, drawn, unit, caption.lower(), from_zero=True)}</figure>"
        for chart_id, caption, drawn, unit in charts
    )


def _rate(value: float | None, unit: str) -> str:
    return "-" if value is None else f"{figure(value)} {unit}"


async def device_page(request: web.Request) -> web.Response:
    hub = context_of(request)
    device_id = request.match_info["device_id"]
    async with hub.engine.connect() as connection:
        device = await fleetdb.get_device(connection, device_id)
        if device is None:
            return _page("Not found", f"<p>No device {_e(device_id)}.</p>", status=404)
        # one report more than the charts show: the first shown point's rates need the one
        # before it
        count = hub.settings.chart_points
        states = await fleetdb.device_history(connection, device_id, limit=count + 1, kind="state")
        history = await fleetdb.device_history(
            connection, device_id, limit=hub.settings.page_size, skip_kind="state"
        )
    states.reverse()  # oldest first, as the charts draw them
    traffic = {name: found.newest(count) for name, found in model_series(states).items()}
    states = states[-count:]
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
    none = ModelSeries()
    models = _table(
        ["Model", "Version", "Runtime", "Device", "Precision", "Requests", "Errors", "p50 / p95"],
        [
            [
                _e(name),
                _e(version),
                *(
                    _e(device["backends"].get(name, {}).get(k, ""))
                    for k in ("runtime", "device", "precision")
                ),
                _e(_rate(traffic.get(name, none).latest("throughput"), "/s")),
                _e(_rate(traffic.get(name, none).latest("error_pct"), "%")),
                _e(
                    " / ".join(
                        _rate(traffic.get(name, none).latest(p), "ms") for p in ("p50_ms", "p95_ms")
                    )
                ),
            ]
            for name, version in device["models"].items()
        ],
        "models",
    )
    temperature = [
        (e["at"], e["detail"]["max_temp_c"])
        for e in states
        if isinstance(e["detail"].get("max_temp_c"), (int, float))
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
        ],
        "history",
    )
    temperature_chart = line_chart(
        "temperature", [Series("", temperature, TEMPERATURE)], "°C", "temperature"
    )
    body = (
        facts
        + "<h2>Models</h2>"
        + models
        + "<h2>Over time</h2>"
        + f"<p class='muted' id='samples'>From the newest {len(states)} state reports.</p>"
        + "<div class='charts'>"
        + f"<figure><figcaption>Hottest sensor</figcaption>{temperature_chart}</figure>"
        + _traffic_charts(traffic)
        + "</div><h2>History</h2>"
        + events
    )
    return _page(f"Device {device_id}", body)


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
