"""Artifact download against real local HTTP servers that drop, lie, overrun and stall."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from devtools.waiting import until
from edgeagent.hub.serve import artifact_response, create_artifact_app, entity_tag
from edgeagent.updates import download
from edgeagent.updates.download import ArtifactDownload, DownloadError, DownloadLimits

DATA = os.urandom(300_000)
SHA = hashlib.sha256(DATA).hexdigest()
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@pytest.fixture
async def serve(tmp_path: Path) -> AsyncIterator[Callable[[Handler | None], Awaitable[str]]]:
    """Start a server on an ephemeral port: the hub's artifact app, or one custom handler."""
    runners: list[web.AppRunner] = []
    files = tmp_path / "artifacts"
    files.mkdir()
    (files / "a.tar.gz").write_bytes(DATA)

    async def start(handler: Handler | None = None) -> str:
        app = create_artifact_app(files)
        if handler is not None:
            app = web.Application()
            app.router.add_get("/a.tar.gz", handler)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        runners.append(runner)
        port = runner.addresses[0][1]
        return f"http://127.0.0.1:{port}/a.tar.gz"

    yield start
    for runner in runners:
        await runner.cleanup()


async def _fetch(url: str, staging: Path, **kw) -> ArtifactDownload:
    limits = kw.pop("limits", DownloadLimits(retries=2, gap_s=2.0, free_space_margin_bytes=0))
    staging.mkdir(exist_ok=True)
    async with aiohttp.ClientSession() as http:
        job = ArtifactDownload(
            http,
            url,
            size=kw.pop("size", len(DATA)),
            sha256=kw.pop("sha256", SHA),
            staging=staging,
            limits=limits,
            **kw,
        )
        job.result = await job.run()  # type: ignore[attr-defined]
        return job


async def test_plain_download_lands_verified_under_its_hash(serve, tmp_path: Path) -> None:
    seen: list[tuple[int, int]] = []
    job = await _fetch(await serve(None), tmp_path / "s", progress=lambda a, b: seen.append((a, b)))
    assert job.result == tmp_path / "s" / f"{SHA}.tar.gz"
    assert job.result.read_bytes() == DATA
    assert seen[-1] == (len(DATA), len(DATA))
    assert not (tmp_path / "s" / f"{SHA}.part").exists()


def _dropping(path_data: bytes, etag: str | None, files: Path) -> Handler:
    hits = {"n": 0}

    async def handler(request: web.Request) -> web.StreamResponse:
        hits["n"] += 1
        if hits["n"] == 1:
            headers = {"Content-Length": str(len(path_data))}
            if etag:
                headers["ETag"] = etag
            response = web.StreamResponse(headers=headers)
            await response.prepare(request)
            await response.write(path_data[:100_000])
            assert request.transport is not None
            request.transport.close()
            return response
        return await artifact_response(request, files / "a.tar.gz")

    return handler


async def test_a_dropped_connection_resumes_with_range(serve, tmp_path: Path) -> None:
    url = await serve(_dropping(DATA, None, tmp_path / "artifacts"))
    job = await _fetch(url, tmp_path / "s")
    assert job.result.read_bytes() == DATA
    assert job.resumed_from and job.resumed_from[0] >= 100_000 - 65536


async def test_if_range_with_the_same_file_resumes(serve, tmp_path: Path) -> None:
    etag = entity_tag(tmp_path / "artifacts" / "a.tar.gz")
    url = await serve(_dropping(DATA, etag, tmp_path / "artifacts"))
    job = await _fetch(url, tmp_path / "s")
    assert job.result.read_bytes() == DATA
    assert len(job.resumed_from) == 1


async def test_if_range_with_a_changed_file_restarts_from_zero(serve, tmp_path: Path) -> None:
    url = await serve(_dropping(DATA, '"an-older-file"', tmp_path / "artifacts"))
    job = await _fetch(url, tmp_path / "s")
    assert job.result.read_bytes() == DATA
    assert job.resumed_from == []  # the server answered 200: the partial file was discarded


async def test_a_206_starting_elsewhere_is_not_spliced(serve, tmp_path: Path) -> None:
    staging = tmp_path / "s"
    staging.mkdir()
    (staging / f"{SHA}.part").write_bytes(DATA[:1000])

    async def lying(request: web.Request) -> web.StreamResponse:
        if request.headers.get("Range"):
            return web.Response(
                status=206,
                body=DATA[:5000],
                headers={"Content-Range": f"bytes 0-4999/{len(DATA)}"},
            )
        return web.Response(body=DATA)

    job = await _fetch(await serve(lying), staging)
    assert job.result.read_bytes() == DATA


async def test_more_than_the_signed_length_is_refused(serve, tmp_path: Path) -> None:
    async def endless(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        for _ in range(10):
            await response.write(DATA)
        return response

    with pytest.raises(DownloadError) as info:
        await _fetch(await serve(endless), tmp_path / "s")
    assert info.value.code == "too_large"
    assert list((tmp_path / "s").iterdir()) == []


async def test_a_shorter_artifact_is_reported_truncated(serve, tmp_path: Path) -> None:
    with pytest.raises(DownloadError) as info:
        await _fetch(await serve(None), tmp_path / "s", size=len(DATA) + 10)
    assert info.value.code == "truncated"


@pytest.mark.parametrize("damaged", [False, True])
async def test_a_part_left_by_an_earlier_process_is_hashed_into_the_resumed_transfer(
    serve, tmp_path: Path, damaged: bool
) -> None:
    """The hash is fed as bytes arrive; a resumed part's own bytes count, not the server's."""
    staging = tmp_path / "s"
    staging.mkdir()
    prefix = bytearray(DATA[:1000])
    prefix[500] ^= 0xFF if damaged else 0
    (staging / f"{SHA}.part").write_bytes(bytes(prefix))
    if damaged:
        with pytest.raises(DownloadError) as info:
            await _fetch(await serve(None), staging, limits=DownloadLimits(retries=0))
        assert info.value.code == "hash_mismatch" and list(staging.iterdir()) == []
        return
    job = await _fetch(await serve(None), staging)
    assert job.result.read_bytes() == DATA and job.resumed_from == [1000]


async def test_a_substituted_artifact_fails_the_hash_and_is_deleted(serve, tmp_path: Path) -> None:
    with pytest.raises(DownloadError) as info:
        await _fetch(await serve(None), tmp_path / "s", sha256="0" * 64)
    assert info.value.code == "hash_mismatch"
    assert list((tmp_path / "s").iterdir()) == []


async def test_a_stalled_server_hits_the_gap_timeout(serve, tmp_path: Path) -> None:
    async def stall(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Length": str(len(DATA))})
        await response.prepare(request)
        await response.write(DATA[:1000])
        await asyncio.sleep(2)
        return response

    limits = DownloadLimits(retries=0, gap_s=0.3, free_space_margin_bytes=0)
    with pytest.raises(DownloadError, match="no data for") as info:
        await _fetch(await serve(stall), tmp_path / "s", limits=limits)
    assert info.value.code == "download_failed"


async def test_not_enough_free_space_is_refused_before_connecting(tmp_path: Path) -> None:
    limits = DownloadLimits(free_space_margin_bytes=1 << 62)
    with pytest.raises(DownloadError, match="free_space_margin_bytes") as info:
        await _fetch("http://127.0.0.1:9/a.tar.gz", tmp_path / "s", limits=limits)
    assert info.value.code == "no_space"


async def test_a_paused_download_waits_for_the_governor(serve, tmp_path: Path) -> None:
    state = {"paused": True}
    asked: list[bool] = []

    def paused() -> bool:
        asked.append(state["paused"])
        return state["paused"]

    url = await serve(None)
    task = asyncio.create_task(_fetch(url, tmp_path / "s", paused=paused))
    await until(lambda: len(asked) >= 3)  # the download asked, waited, and asked again
    assert not task.done() and not (tmp_path / "s" / f"{SHA}.part").exists()
    state["paused"] = False
    job = await asyncio.wait_for(task, 10)
    assert job.result.read_bytes() == DATA


async def test_http_errors_name_the_status(serve, tmp_path: Path) -> None:
    async def missing(request: web.Request) -> web.StreamResponse:
        raise web.HTTPNotFound()

    with pytest.raises(DownloadError, match="HTTP 404"):
        await _fetch(await serve(missing), tmp_path / "s")


async def test_the_overall_deadline_stops_a_trickling_server(serve, tmp_path: Path) -> None:
    async def trickle(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Length": str(len(DATA))})
        await response.prepare(request)
        for start in range(0, len(DATA), 100):  # never silent for long: the gap never fires
            await response.write(DATA[start : start + 100])
            await asyncio.sleep(0.05)
        return response

    limits = DownloadLimits(timeout_s=0.5, gap_s=5.0, free_space_margin_bytes=0)
    with pytest.raises(DownloadError, match="not complete within") as info:
        await _fetch(await serve(trickle), tmp_path / "s", limits=limits)
    assert info.value.code == "timeout"


# 300 bytes in 0.2 s is 1,500 B/s: below this minimum rate
SLOW_LIMITS = DownloadLimits(retries=0, gap_s=5.0, min_rate_bps=10_000, free_space_margin_bytes=0)


def _late(chunks: list[bytes], delay_s: float) -> Handler:
    """A busy server: each chunk of the body comes ``delay_s`` after the one before."""

    async def handler(request: web.Request) -> web.StreamResponse:
        length = sum(map(len, chunks))
        response = web.StreamResponse(headers={"Content-Length": str(length)})
        await response.prepare(request)
        for chunk in chunks:
            await asyncio.sleep(delay_s)
            await response.write(chunk)
        return response

    return handler


async def test_a_small_artifact_arriving_late_in_one_chunk_is_taken(
    serve, tmp_path: Path, monkeypatch
) -> None:
    """Found by the fleet simulator: 38 of 10,000 devices refused a 300-byte artifact as
    "slow" because its only chunk came after the rate check's grace period."""
    monkeypatch.setattr(download, "_RATE_GRACE_S", 0.05)
    small = DATA[:300]
    job = await _fetch(
        await serve(_late([small], 0.2)),
        tmp_path / "s",
        size=len(small),
        sha256=hashlib.sha256(small).hexdigest(),
        limits=SLOW_LIMITS,
    )
    assert job.result.read_bytes() == small


async def test_an_unfinished_download_below_the_minimum_rate_is_slow(
    serve, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.setattr(download, "_RATE_GRACE_S", 0.05)
    small = DATA[:300]
    with pytest.raises(DownloadError, match="below the minimum") as info:
        await _fetch(
            await serve(_late([small[:100], small[100:]], 0.2)),
            tmp_path / "s",
            size=len(small),
            sha256=hashlib.sha256(small).hexdigest(),
            limits=SLOW_LIMITS,
        )
    assert info.value.code == "slow"


async def test_a_5000_digit_content_range_total_is_not_parsed(serve, tmp_path: Path) -> None:
    """Network numbers are bounded before int(): a huge total is a range we did not ask for
    (restart from zero), never a ValueError out of the download."""
    staging = tmp_path / "s"
    staging.mkdir()
    (staging / f"{SHA}.part").write_bytes(DATA[:1000])

    async def huge(request: web.Request) -> web.StreamResponse:
        if request.headers.get("Range"):
            total = "9" * 5000
            return web.Response(
                status=206, body=DATA[1000:], headers={"Content-Range": f"bytes 1000-1/{total}"}
            )
        return web.Response(body=DATA)

    job = await _fetch(await serve(huge), staging)
    assert job.result.read_bytes() == DATA and job.resumed_from == []


async def test_the_gap_timeout_covers_waiting_for_response_headers(serve, tmp_path) -> None:
    """A server that accepts and then never answers is a stall like any other (before: the
    download waited for headers until its overall deadline)."""
    never = asyncio.Event()

    async def silent(request: web.Request) -> web.StreamResponse:
        await never.wait()
        return web.Response(body=DATA)

    limits = DownloadLimits(retries=0, gap_s=0.3, timeout_s=120, free_space_margin_bytes=0)
    try:
        with pytest.raises(DownloadError, match="no data for") as info:
            await _fetch(await serve(silent), tmp_path / "s", limits=limits)
    finally:
        never.set()  # let the handler finish, so the server shuts down at once
    assert info.value.code == "download_failed"
