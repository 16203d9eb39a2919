"""``edgeagent hub serve DIR``: the artifact HTTP server devices download releases from.

Artifacts are immutable files named by the hub (``<model>-<version>.tar.gz``), so the server
is deliberately plain: one flat directory, no listing, no paths with ``/`` or ``..``. aiohttp's
FileResponse gives most of what resumable downloads need — ``Range`` (206 with
``Content-Range``), a strong ``ETag``, ``sendfile`` — but it evaluates ``If-Range`` only as a
date, so an entity-tag ``If-Range`` is checked here: when it does not match the file, the
``Range`` is dropped and the whole file is sent (RFC 9110 §13.1.5), so a client never splices
bytes of two different files. Integrity does not depend on
this server: devices check the signed length and SHA-256, so a plain-HTTP mirror or CDN is fine.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import ssl
from pathlib import Path

from aiohttp import web

log = logging.getLogger(__name__)

_FILE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,200}$")


def entity_tag(path: Path) -> str:
    """The strong ETag aiohttp's FileResponse sends for ``path`` (modification time and size)."""
    stat = path.stat()
    return f'"{stat.st_mtime_ns:x}-{stat.st_size:x}"'


async def artifact_response(request: web.Request, path: Path) -> web.StreamResponse:
    """Serve ``path`` with Range support, honouring an entity-tag ``If-Range`` too."""
    if_range = request.headers.get("If-Range", "")
    if if_range.startswith(('"', "W/")) and if_range != entity_tag(path):
        return await _whole_file(request, path)
    return web.FileResponse(path, headers={"Cache-Control": "no-transform"})


async def _whole_file(request: web.Request, path: Path) -> web.StreamResponse:
    """A plain 200 with the entire file, ignoring ``Range`` (the client's copy is stale)."""
    response = web.StreamResponse(
        headers={
            "Content-Type": "application/octet-stream",
            "Content-Length": str(path.stat().st_size),
            "ETag": entity_tag(path),
        }
    )
    await response.prepare(request)
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            await response.write(chunk)
    await response.write_eof()
    return response


def create_artifact_app(directory: Path) -> web.Application:
    """An aiohttp app serving the regular files directly inside ``directory`` (GET and HEAD)."""
    root = Path(directory).resolve()

    async def artifact(request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        path = root / name
        if not _FILE_RE.match(name) or path.is_symlink() or not path.is_file():
            raise web.HTTPNotFound(text=f"no artifact named {name!r}\n")
        return await artifact_response(request, path)

    app = web.Application()
    app.router.add_get("/{name}", artifact)
    return app


async def start_artifact_server(
    directory: Path,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    tls: ssl.SSLContext | None = None,
) -> tuple[web.AppRunner, str]:
    """Start serving ``directory`` (HTTPS with ``tls``); return the runner and the base URL."""
    runner = web.AppRunner(create_artifact_app(directory), access_log=log)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=tls)
    await site.start()
    bound = runner.addresses[0][1] if runner.addresses else port
    shown = f"[{host}]" if ":" in host else host
    return runner, f"{'https' if tls else 'http'}://{shown}:{bound}"


def server_tls(cert: Path | None, key: Path | None) -> ssl.SSLContext | None:
    """A server context from a certificate chain and key, or None for plain HTTP."""
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise ValueError("HTTPS needs both a certificate and its key")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(cert), str(key))
    return context


async def serve_forever(
    directory: Path, host: str, port: int, tls: ssl.SSLContext | None = None
) -> None:
    """Run until interrupted, printing the base URL releases should point at."""
    runner, url = await start_artifact_server(directory, host, port, tls=tls)
    print(f"serving {Path(directory).resolve()} at {url}/", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        with contextlib.suppress(Exception):
            await runner.cleanup()
