"""Devices' samples arriving at the hub: the upload and policy routes of ``fleet.samples``.

Everything an upload claims is checked before anything is written: the device token (its
own, from ``--device-tokens``), the device's group (``--samples-group``), the size (read up to
``--max-sample-bytes`` and no further), the record (``fleet.samples.parse_record``), that the
record names the token's device and the path's id, and that the body is a JPEG of the size the
record states. Only then is the image stored (``<model>/<version>/<device>/<id>-<sha>.jpg``
in the blob store: a file written atomically, or one S3 object) and its row inserted; a refusal
leaves nothing. A store that does not answer or refuses is a 503 the device tries again later
(nothing in the database); a row the database refuses after the image was stored (another image
under that id) takes the image away again.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import logging

from aiohttp import web

from edgeagent.fleet.samples import (
    JPEG_MAGIC,
    POLICY_PATH,
    RECORD_HEADER,
    SAMPLE_ID_RE,
    UPLOAD_PATH,
    SampleRecord,
    decode_record,
)
from edgeagent.fleet.wire import MessageError
from edgeagent.hub.blobs import BlobError, BlobStore, StoreUnavailable
from edgeagent.hub.server import samples_db
from edgeagent.hub.server.context import context_of
from edgeagent.hub.server.samples_auth import DeviceTokens, Uploader
from edgeagent.hub.server.samples_settings import SamplesSettings

log = logging.getLogger(__name__)

DEVICE_TOKENS = web.AppKey("hub_device_tokens", DeviceTokens)
BLOBS = web.AppKey("hub_sample_blobs", BlobStore)
RETRY_AFTER_S = 60  # a device's uploader tries again at its next round anyway


def blobs_of(request: web.Request) -> BlobStore:
    return request.app[BLOBS]


def _refuse(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def _uploader(request: web.Request) -> Uploader | None:
    return request.app[DEVICE_TOKENS].uploader(request.headers.get("Authorization", ""))


async def policy(request: web.Request) -> web.Response:
    uploader = _uploader(request)
    if uploader is None:
        return _refuse(401, "missing or unknown device upload token")
    settings = context_of(request).settings.samples
    return web.json_response(
        {
            "device_id": uploader.device_id,
            "group": uploader.group,
            "upload": settings.allows(uploader.group),
            "max_sample_bytes": settings.max_sample_bytes,
        }
    )


async def _body(request: web.Request, limit: int) -> bytes | None:
    """The body, or None as soon as it passes ``limit`` (the rest is never read)."""
    if request.content_length is not None and request.content_length > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def _image_problem(data: bytes, record: SampleRecord) -> str | None:
    if not data.startswith(JPEG_MAGIC):
        return "the body is not a JPEG image"
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.format != "JPEG":
                return "the body is not a JPEG image"
            size = image.size
            image.verify()
    except Exception as exc:  # Pillow raises many kinds for a broken file
        return f"the JPEG does not decode: {exc}"
    if size != (record.width, record.height):
        return f"the image is {size[0]}x{size[1]}, the record says {record.width}x{record.height}"
    return None


async def upload(request: web.Request) -> web.Response:
    uploader = _uploader(request)
    if uploader is None:
        return _refuse(401, "missing or unknown device upload token")
    hub = context_of(request)
    settings = hub.settings.samples
    if not settings.allows(uploader.group):
        return _refuse(403, f"group {uploader.group!r} is not enabled for sample uploads")
    sample_id = request.match_info["sample_id"]
    if not SAMPLE_ID_RE.match(sample_id):
        return _refuse(400, "the path's sample id is malformed")
    try:
        record = decode_record(request.headers.get(RECORD_HEADER, ""))
    except MessageError as exc:
        return _refuse(400, str(exc))
    if record.id != sample_id:
        return _refuse(400, f"the record's id {record.id!r} is not the path's {sample_id!r}")
    if record.device_id != uploader.device_id:
        return _refuse(403, f"this token uploads for {uploader.device_id!r}, not for another")
    data = await _body(request, settings.max_sample_bytes)
    if data is None:
        return _refuse(413, f"a sample is at most {settings.max_sample_bytes} bytes")
    problem = await asyncio.to_thread(_image_problem, data, record)
    if problem is not None:
        return _refuse(400, problem)
    sha = hashlib.sha256(data).hexdigest()
    async with hub.engine.begin() as connection:
        have = await samples_db.existing(connection, record.device_id, record.id)
    if have is not None:
        if have != sha:
            return _refuse(409, "this sample id already holds another image")
        return web.json_response({"stored": False, "duplicate": True}, status=200)
    blob = f"{record.model}/{record.version}/{record.device_id}/{record.id}-{sha[:16]}.jpg"
    store = blobs_of(request)
    try:
        await asyncio.to_thread(store.put, blob, data)
    except StoreUnavailable as exc:
        log.warning("sample %s of %s not stored: %s", record.id, record.device_id, exc)
        response = _refuse(503, f"the hub cannot store samples now: {exc}")
        response.headers["Retry-After"] = str(RETRY_AFTER_S)
        return response
    # A database error here is left alone: the commit may have landed, and the device's retry
    # puts the same bytes under the same key before it inserts again.
    async with hub.engine.begin() as connection:
        outcome = await samples_db.insert(connection, record, sha, len(data), blob)
    if outcome == samples_db.CONFLICT:
        await _forget(store, blob)
        return _refuse(409, "this sample id already holds another image")
    return web.json_response(
        {"stored": outcome == samples_db.STORED, "duplicate": outcome == samples_db.DUPLICATE},
        status=201 if outcome == samples_db.STORED else 200,
    )


async def _forget(store: BlobStore, blob: str) -> None:
    """Delete an image no row will name; a store failing now leaves an orphan, logged."""
    try:
        await asyncio.to_thread(store.delete, blob)
    except BlobError as exc:
        log.warning("image %s has no row and could not be deleted: %s", blob, exc)


def install(app: web.Application, settings: SamplesSettings, blobs: BlobStore) -> None:
    """Add the device routes to the hub's app with the device tokens (none: every upload 401)
    and the store their images go to."""
    app[DEVICE_TOKENS] = (
        DeviceTokens.load(settings.device_tokens) if settings.device_tokens else DeviceTokens({})
    )
    app[BLOBS] = blobs
    app.add_routes([web.get(POLICY_PATH, policy), web.put(UPLOAD_PATH, upload)])
