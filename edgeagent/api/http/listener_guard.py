"""The agent's binding of the shared listener guard (``edgeagent.httpguard``).

What is the agent's own: the guard checks TCP requests only (a browser cannot open the Unix
socket, so curl's default form type keeps working there), the extra names are
``[server] allowed_hosts``, and the only routes that take a browser-sendable body are DeepStack's
multipart uploads (``deepstack_routes``), which check the token they carry themselves
(``auth.form_credentials``): a page on another origin can send such a form but cannot know the
token, and its ``Origin`` is refused before the form is read. Their refusals keep DeepStack's
error shape.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from edgeagent.api.auth import over_tcp, takes_form_credentials
from edgeagent.api.http.deepstack_routes import FORM_TYPES, error_body
from edgeagent.api.settings import ServerSettings
from edgeagent.httpguard import Guard


def _deepstack_form(request: web.Request) -> bool:
    return takes_form_credentials(request) and request.content_type in FORM_TYPES


def _refusal_body(request: web.Request, status: int, message: str) -> dict[str, Any]:
    """DeepStack clients read ``success``: a Compose service name missing from
    ``allowed_hosts`` must reach Frigate's log as a failed request, not as no detections."""
    if takes_form_credentials(request):
        return error_body(status, message)
    return {"error": message}


def agent_guard(settings: ServerSettings) -> Guard:
    """The guard of the agent's TCP listener."""
    return Guard(
        listen_host=settings.tcp_host,
        allowed_hosts=tuple(settings.allowed_hosts),
        hosts_key="[server] allowed_hosts",
        applies=over_tcp,
        form_route=_deepstack_form,
        body=_refusal_body,
    )
