"""The agent's binding of the shared listener guard (``edgeagent.httpguard``).

What is the agent's own: the guard checks TCP requests only (a browser cannot open the Unix
socket, so curl's default form type keeps working there), the extra names are
``[server] allowed_hosts``, and the one route that takes a browser-sendable body is DeepStack's
multipart upload, which checks the token it carries itself (``auth.form_credentials``).
"""

from __future__ import annotations

from aiohttp import web

from edgeagent.api.auth import over_tcp, takes_form_credentials
from edgeagent.api.settings import ServerSettings
from edgeagent.httpguard import Guard


def _deepstack_form(request: web.Request) -> bool:
    return takes_form_credentials(request) and request.content_type == "multipart/form-data"


def agent_guard(settings: ServerSettings) -> Guard:
    """The guard of the agent's TCP listener."""
    return Guard(
        listen_host=settings.tcp_host,
        allowed_hosts=tuple(settings.allowed_hosts),
        hosts_key="[server] allowed_hosts",
        applies=over_tcp,
        form_route=_deepstack_form,
    )
