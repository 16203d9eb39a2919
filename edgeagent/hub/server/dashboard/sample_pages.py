"""The samples pages: review what devices captured, and label it.

- ``/ui/samples`` — per model and version, how many samples are new, accepted, corrected or
  rejected;
- ``/ui/samples/{model}/{version}`` — a page of samples (``?status=``, ``?offset=``): each image
  with the model's answer and, for admins, Accept (the model was right: its class or boxes
  become the label), Correct (a class name, or the boxes as JSON ``[{"label", "box"}]``) and
  Reject (not used for training);
- ``/ui/samples/image/{id}`` — the image itself (read scope, like every page).

The verdict is a ``fetch`` POST with the page's CSRF token, as on the deployment pages. The
pages allow images from this host only (``img-src 'self'`` added to the page's CSP).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from edgeagent.hub.blobs import BlobMissing, StoreUnavailable
from edgeagent.hub.datasets.export import label
from edgeagent.hub.server import samples_db
from edgeagent.hub.server.auth import csrf_token, may_change, needs
from edgeagent.hub.server.context import BadRequest, context_of
from edgeagent.hub.server.dashboard.markup import escape, page, table
from edgeagent.hub.server.dashboard.scripts import page_script
from edgeagent.hub.server.samples_api import blobs_of

PAGE_SIZE = 48
MAX_BOXES = 100

REVIEW = """
on('button[data-verdict]', async (e) => {
  const card = e.currentTarget.closest('[data-sample]');
  const verdict = e.currentTarget.dataset.verdict;
  const body = {status: verdict};
  if (verdict === 'corrected') {
    const field = card.querySelector('.correction');
    if (page.task === 'classification') body.label = field.value.trim();
    else {
      try { body.detections = JSON.parse(field.value); }
      catch (err) { say(`the boxes are not JSON: ${err}`, true); return; }
    }
  }
  const done = await post(`/ui/samples/${card.dataset.sample}/review`, body);
  if (done !== null) {
    card.querySelector('.status').textContent = done.status;
    say(`sample ${card.dataset.sample}: ${done.status}`);
  }
});
"""


def _with_images(response: web.Response) -> web.Response:
    policy = response.headers["Content-Security-Policy"]
    response.headers["Content-Security-Policy"] = policy + "; img-src 'self'"
    return response


async def samples_index(request: web.Request) -> web.Response:
    async with context_of(request).engine.connect() as connection:
        counts = await samples_db.summary(connection)
    grouped: dict[tuple[str, str], dict[str, int]] = {}
    for row in counts:
        grouped.setdefault((row["model"], row["version"]), {})[row["status"]] = row["count"]
    rows = [
        [
            f"<a href='/ui/samples/{escape(model)}/{escape(version)}'>{escape(model)}</a>",
            escape(version),
            *(str(found.get(s, 0)) for s in samples_db.STATUSES),
        ]
        for (model, version), found in sorted(grouped.items())
    ]
    body = (
        table(["Model", "Version", *samples_db.STATUSES], rows, "samples")
        if rows
        else "<p>No samples yet: devices upload them when [capture] upload is on and their "
        "group is enabled (--samples-group).</p>"
    )
    return page("Samples", body)


def _answer(row: dict[str, Any]) -> str:
    outputs = row["outputs"]
    if row["task"] == "classification":
        pairs = zip(outputs.get("labels", []), outputs.get("scores", []), strict=False)
        return ", ".join(f"{escape(name)} {score:.2f}" for name, score in list(pairs)[:3])
    found = outputs.get("detections", [])
    return f"{len(found)} box(es): " + ", ".join(
        f"{escape(d['label'])} {d['score']:.2f}" for d in found[:5]
    )


def _card(row: dict[str, Any], admin: bool) -> str:
    shown = label(row)
    if row["task"] == "classification":
        field = f"<input class='correction' value='{escape(shown.get('label', ''))}'>"
    else:
        field = f"<textarea class='correction'>{escape(json.dumps(shown['detections']))}</textarea>"
    actions = (
        f"{field}<button data-verdict='accepted'>Accept</button>"
        "<button data-verdict='corrected'>Correct</button>"
        "<button data-verdict='rejected'>Reject</button>"
        if admin
        else ""
    )
    return (
        f"<figure data-sample='{row['id']}'><img src='/ui/samples/image/{row['id']}' "
        f"alt='sample {row['id']}' width='{min(row['width'], 160)}'>"
        f"<figcaption>{escape(row['device_id'])}: {_answer(row)} · "
        f"<span class='status'>{escape(row['status'])}</span></figcaption>{actions}</figure>"
    )


async def samples_page(request: web.Request) -> web.Response:
    model, version = request.match_info["model"], request.match_info["version"]
    status = request.query.get("status") or None
    if status is not None and status not in samples_db.STATUSES:
        raise BadRequest(400, f"?status=: one of {', '.join(samples_db.STATUSES)}")
    try:
        offset = max(0, int(request.query.get("offset", "0")))
    except ValueError:
        raise BadRequest(400, "?offset=: an integer") from None
    async with context_of(request).engine.connect() as connection:
        rows = await samples_db.listing(
            connection,
            model=model,
            version=version,
            status=status,
            limit=PAGE_SIZE,
            offset=offset,
        )
    admin = may_change(request)
    cards = "".join(_card(row, admin) for row in rows) or "<p>No samples here.</p>"
    task = rows[0]["task"] if rows else "classification"
    more = (
        f"<p><a id='next' href='?offset={offset + PAGE_SIZE}"
        f"{f'&amp;status={escape(status)}' if status else ''}'>next page →</a></p>"
        if len(rows) == PAGE_SIZE
        else ""
    )
    body = f"<p id='message'></p><div id='cards'>{cards}</div>{more}"
    script = page_script({"csrf": csrf_token(request), "task": task}, REVIEW)
    return _with_images(page(f"Samples of {model} {version}", body, script))


async def sample_image(request: web.Request) -> web.StreamResponse:
    hub = context_of(request)
    try:
        row_id = int(request.match_info["sample"])
    except ValueError:
        raise web.HTTPNotFound() from None
    async with hub.engine.connect() as connection:
        row = await samples_db.one(connection, row_id)
    if row is None:
        raise web.HTTPNotFound()
    try:
        data = await asyncio.to_thread(blobs_of(request).get, row["blob"])
    except BlobMissing:
        raise web.HTTPNotFound() from None
    except StoreUnavailable as exc:
        raise web.HTTPServiceUnavailable(text=str(exc)) from None
    return web.Response(body=data, content_type="image/jpeg")


def _annotation(row: dict[str, Any], body: dict[str, Any]) -> dict[str, Any] | None:
    status = body.get("status")
    if status == "accepted":
        outputs_label = dict(row, annotation=None)
        return label(outputs_label)
    if status == "rejected":
        return None
    if status != "corrected":
        raise BadRequest(400, "status must be accepted, corrected or rejected")
    if row["task"] == "classification":
        name = body.get("label")
        if not isinstance(name, str) or not name or len(name) > 128:
            raise BadRequest(400, "a correction of a classifier's sample names its class (label)")
        return {"label": name}
    boxes = body.get("detections")
    if not isinstance(boxes, list) or len(boxes) > MAX_BOXES:
        raise BadRequest(400, f"detections: a list of at most {MAX_BOXES} boxes")
    checked = []
    for box in boxes:
        ok = (
            isinstance(box, dict)
            and isinstance(box.get("label"), str)
            and isinstance(box.get("box"), list)
            and len(box["box"]) == 4
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in box["box"])
        )
        if not ok:
            raise BadRequest(400, 'each box is {"label": "...", "box": [x1, y1, x2, y2]}')
        x1, y1, x2, y2 = (float(v) for v in box["box"])
        if not (0 <= x1 < x2 <= row["width"] and 0 <= y1 < y2 <= row["height"]):
            size = f"{row['width']}x{row['height']}"
            raise BadRequest(400, f"box {box['box']} is not inside the {size} image")
        checked.append({"label": box["label"], "box": [x1, y1, x2, y2]})
    return {"detections": checked}


@needs("admin")
async def review(request: web.Request) -> web.Response:
    hub = context_of(request)
    try:
        row_id = int(request.match_info["sample"])
        body = await request.json()
    except ValueError:
        raise BadRequest(400, "the body must be JSON with a status") from None
    if not isinstance(body, dict):
        raise BadRequest(400, "the body must be a JSON object")
    async with hub.engine.begin() as connection:
        row = await samples_db.one(connection, row_id)
        if row is None:
            raise BadRequest(404, f"no sample {row_id}")
        annotation = _annotation(row, body)
        await samples_db.review(connection, row_id, body["status"], annotation)
    return web.json_response({"id": row_id, "status": body["status"], "annotation": annotation})


def sample_routes() -> list[web.RouteDef]:
    return [
        web.get("/ui/samples", samples_index),
        web.get("/ui/samples/image/{sample}", sample_image),
        web.get("/ui/samples/{model}/{version}", samples_page),
        web.post("/ui/samples/{sample}/review", review),
    ]
