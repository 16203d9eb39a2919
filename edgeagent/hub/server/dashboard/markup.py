"""What every dashboard page is made of: the frame with its nonce'd style and script, tables,
escaping for HTML and for data handed to a page's script, times.

Each page allows only its own script and style (a nonce in its Content-Security-Policy), so
there are no inline ``style=`` or ``onclick=`` attributes anywhere.
"""

from __future__ import annotations

import html
import json
import secrets
import time
from typing import Any
from urllib.parse import urlencode

from aiohttp import web

from edgeagent.httpguard import page_policy

STYLE = """
body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}
table{border-collapse:collapse;margin:.5em 0}td,th{border-bottom:1px solid #ddd;padding:3px 8px;
text-align:left}th{background:#f4f4f4}.counts span{margin-right:1.5em;font-weight:600}
.ok{color:#17803d}.bad{color:#b3261e}.muted{color:#777}form.filters input,form.filters select
{margin-right:.5em}.bar{fill:#17803d}.bar.fail{fill:#b3261e}.bar.wait{fill:#ccc}
.bar.none{fill:#eee}button{margin-right:.5em}.charts{display:flex;flex-wrap:wrap;gap:0 1.5em}
figure{margin:0 0 .8em}figcaption{font-weight:600;margin-bottom:.2em}
svg.chart .plot{fill:#fff;stroke:#ddd}
fieldset{border:1px solid #ddd;margin:.8em 0;padding:.5em .8em}fieldset input,fieldset select
{margin:0 .8em .3em .3em}#message:empty{display:none}
"""


def escape(value: Any) -> str:
    return html.escape("" if value is None else str(value))


def script_data(value: Any) -> str:
    """``value`` as a JavaScript literal that is safe inside ``<script>``: JSON with ``<``,
    ``>`` and ``&`` escaped, so a device id like ``</script>`` cannot end the script."""
    text = json.dumps(value, separators=(",", ":"))
    for raw, safe in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        text = text.replace(raw, safe)
    return text.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def page(title: str, body: str, script: str = "", status: int = 200) -> web.Response:
    """A whole page; its style and script run by this answer's nonce, nothing else does."""
    nonce = secrets.token_urlsafe(16)
    document = (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{escape(title)} · edgeagent "
        f"hub</title><style nonce='{nonce}'>{STYLE}</style></head><body><nav><a href='/'>Fleet"
        f"</a> · <a href='/ui/deployments'>Deployments</a></nav><h1>{escape(title)}</h1>{body}"
        f"{f'<script nonce={nonce!r}>{script}</script>' if script else ''}</body></html>"
    )
    return web.Response(
        text=document,
        content_type="text/html",
        status=status,
        headers={"Content-Security-Policy": page_policy(nonce)},
    )


def table(headers: list[str], rows: list[list[str]], table_id: str = "") -> str:
    """Cells are HTML already (callers escape what they did not write themselves)."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    ident = f" id='{table_id}'" if table_id else ""
    return f"<table{ident}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def next_page(path: str, request: web.Request, limit: int, offset: int, total: int) -> str:
    """A link to the rows after this page (same filters), or nothing on the last page."""
    if offset + limit >= total:
        return ""
    query = {**request.query, "offset": str(offset + limit)}
    return f"<p><a id='next' href='{escape(path)}?{escape(urlencode(query))}'>next page →</a></p>"


def when(at: float | None) -> str:
    """A time of the hub's clock as the operator reads it ('-' for never)."""
    if at is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))
