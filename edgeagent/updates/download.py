"""Fetch a release artifact: resumable, length-capped, time-boxed, hash-checked.

The signed manifest tells us the artifact's exact length and SHA-256 before the first byte
arrives, so the download can defend itself the way TUF clients do:

- *endless data*: never store more than the signed length; a longer body is refused at once;
- *slow retrieval*: a gap time-out between reads, an overall deadline and a minimum average rate;
- *interrupted transfers*: bytes go to ``staging/<sha256>.part``; a retry (or a restart of the
  agent) resumes with ``Range`` and, when the server gave a validator, ``If-Range``. Only a 206
  whose ``Content-Range`` starts exactly where we stopped is appended; anything else restarts;
- *substitution*: the SHA-256 of the whole file, fed as the bytes arrive (no second read of a
  large artifact), is checked before the file is handed to the unpacker;
- *disk exhaustion*: the free space for the rest of the file plus a margin is checked first.

While the governor says ``pause_downloads`` the connection is closed and the transfer waits;
paused time does not count against the deadline.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import logging
import re
import shutil
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from edgeagent.fleet import outcomes

log = logging.getLogger(__name__)

_CHUNK = 256 * 1024
_RATE_GRACE_S = 30.0  # the minimum average rate applies after this much active time
# Network text: whole-string, ASCII digits, at most 20 of them (2**64 has 20), so int() on it
# is cheap and can never raise on a 5000-digit "total".
_MAX_VALIDATOR_CHARS = 256  # an ETag or HTTP date is short; anything longer is not kept
_CONTENT_RANGE_RE = re.compile(r"\Abytes ([0-9]{1,20})-([0-9]{1,20})/([0-9]{1,20}|\*)\Z", re.ASCII)


class DownloadError(RuntimeError):
    """The artifact could not be fetched; ``code`` is reported to the hub as the reason."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class _Retry(Exception):
    """A transient failure of one attempt: resume from what is on disk."""


@dataclass(frozen=True)
class DownloadLimits:
    """The knobs from [updates], passed explicitly so the downloader has no config coupling."""

    timeout_s: float = 900.0
    gap_s: float = 30.0
    min_rate_bps: int = 1024
    retries: int = 5
    free_space_margin_bytes: int = 64 * 1024 * 1024


ProgressFn = Callable[[int, int], None]


@functools.lru_cache(maxsize=8)
def tls_context(ca_file: Path | None) -> ssl.SSLContext:
    """The verifying context for https artifact URLs, built once per CA bundle.

    Building one reads and parses the whole CA bundle (about 60 ms of CPU on an x86 server,
    far more on a small board); doing that for every artifact of every release was most of an
    install's CPU time in the fleet simulator.
    """
    return ssl.create_default_context(cafile=str(ca_file) if ca_file else None)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _prefix_sha256(path: Path, size: int) -> hashlib._Hash:
    """A running SHA-256 of the first ``size`` bytes of ``path`` (a resumed partial file)."""
    digest = hashlib.sha256()
    if size == 0:  # a fresh start: the part may not exist yet
        return digest
    with path.open("rb") as handle:
        while size > 0 and (chunk := handle.read(min(1 << 20, size))):
            digest.update(chunk)
            size -= len(chunk)
    return digest


class ArtifactDownload:
    """One artifact's transfer into ``staging``; ``run()`` returns the verified file's path."""

    def __init__(
        self,
        http: aiohttp.ClientSession,
        url: str,
        *,
        size: int,
        sha256: str,
        staging: Path,
        limits: DownloadLimits,
        paused: Callable[[], bool] = lambda: False,
        progress: ProgressFn | None = None,
    ) -> None:
        if not re.fullmatch(r"[0-9a-f]{64}", sha256):
            raise DownloadError(
                outcomes.MALFORMED, f"artifact sha256 {sha256!r} is not 64 hex digits"
            )
        self.http = http
        self.url = url
        self.size = size
        self.sha256 = sha256
        self.limits = limits
        self.paused = paused
        self.progress = progress
        self.part = staging / f"{sha256}.part"
        self.meta = staging / f"{sha256}.part.json"
        self.final = staging / f"{sha256}.tar.gz"
        self.resumed_from: list[int] = []  # offsets we resumed at (for logs and tests)
        self._last_report = 0.0
        # The SHA-256 of the part's first ``_hashed`` bytes, fed as the bytes arrive, so a
        # complete transfer is verified without reading the file again (a partial file left
        # by an earlier process is hashed once, when its transfer resumes).
        self._digest = hashlib.sha256()
        self._hashed = 0

    async def run(self) -> Path:
        if self.final.exists():
            if await asyncio.to_thread(file_sha256, self.final) == self.sha256:
                return self.final
            self.final.unlink()
        self._check_space()
        remaining = self.limits.timeout_s
        failures = 0
        while True:
            await self._wait_while_paused()
            started = time.monotonic()
            try:
                done = await asyncio.wait_for(self._attempt(), remaining)
            except asyncio.TimeoutError as exc:
                raise DownloadError(
                    outcomes.TIMEOUT,
                    f"{self.url}: not complete within {self.limits.timeout_s:.0f} s",
                ) from exc
            except _Retry as exc:
                failures += 1
                if failures > self.limits.retries:
                    raise DownloadError(
                        outcomes.DOWNLOAD_FAILED,
                        f"{self.url}: gave up after {failures} tries: {exc}",
                    ) from exc
                log.info("download of %s interrupted (%s); resuming", self.url, exc)
                done = False
                await asyncio.sleep(min(5.0, 0.2 * 2**failures))
            remaining -= time.monotonic() - started
            if done:
                break
        return await self._finish()

    # --- one attempt ---------------------------------------------------------------------
    async def _attempt(self) -> bool:
        """Fetch from the current offset; True when complete, False when paused midway."""
        have = self.part.stat().st_size if self.part.exists() else 0
        if have > self.size:
            self._restart()
            have = 0
        if have == self.size:
            return True
        headers = {"Accept-Encoding": "identity"}
        validator = self._validator()
        if have:
            headers["Range"] = f"bytes={have}-"
            if validator:
                headers["If-Range"] = validator
        try:
            # sock_read bounds every wait for bytes, the response headers included (the body
            # loop below has its own gap time-out per chunk).
            timeout = aiohttp.ClientTimeout(
                sock_connect=self.limits.gap_s, sock_read=self.limits.gap_s
            )
            async with self.http.get(self.url, headers=headers, timeout=timeout) as response:
                have = self._accept(response, have)
                return await self._receive(response, have)
        except (aiohttp.ClientError, ConnectionError, asyncio.TimeoutError) as exc:
            if isinstance(exc, asyncio.TimeoutError):
                raise _Retry(f"no data for {self.limits.gap_s:.0f} s") from exc
            raise _Retry(str(exc) or type(exc).__name__) from exc

    def _accept(self, response: aiohttp.ClientResponse, have: int) -> int:
        """Decide from the status line where the body starts; return that offset."""
        if response.status == 416 and have:
            raise DownloadError(
                outcomes.TRUNCATED,
                f"{self.url}: the server has fewer than the signed {self.size} bytes",
            )
        if response.status >= 500 or response.status in (408, 429):
            raise _Retry(f"HTTP {response.status}")
        if response.status not in (200, 206):
            raise DownloadError(outcomes.DOWNLOAD_FAILED, f"{self.url}: HTTP {response.status}")
        offered = response.content_length
        if response.status == 200 and offered is not None and offered > self.size:
            raise DownloadError(
                outcomes.TOO_LARGE, f"{self.url}: {offered} bytes offered, {self.size} signed"
            )
        if response.status == 206:
            match = _CONTENT_RANGE_RE.match(response.headers.get("Content-Range", ""))
            if match and int(match.group(1)) == have:
                if match.group(3) != "*" and int(match.group(3)) > self.size:
                    raise DownloadError(
                        outcomes.TOO_LARGE,
                        f"{self.url}: {match.group(3)} bytes, {self.size} signed",
                    )
                self.resumed_from.append(have)
                return have
            self._restart()  # a range we did not ask for: start over rather than splice
            raise _Retry(f"206 with Content-Range {response.headers.get('Content-Range')!r}")
        if have:
            log.info("%s: server sent the whole file again; restarting", self.url)
        self._restart()
        self._save_validator(response)
        return 0

    async def _receive(self, response: aiohttp.ClientResponse, have: int) -> bool:
        started = time.monotonic()
        received = 0
        if self._hashed != have:  # resuming a part this object did not write, or restarted
            self._digest = await asyncio.to_thread(_prefix_sha256, self.part, have)
            self._hashed = have
        with self.part.open("ab") as out:
            while True:
                chunk = await asyncio.wait_for(response.content.readany(), self.limits.gap_s)
                if not chunk:
                    break
                have += len(chunk)
                if have > self.size:
                    out.close()
                    self._restart()
                    raise DownloadError(
                        outcomes.TOO_LARGE, f"{self.url}: more than the signed {self.size} bytes"
                    )
                out.write(chunk)
                self._digest.update(chunk)
                self._hashed = have
                received += len(chunk)
                self._report(have)
                elapsed = time.monotonic() - started
                # a complete file is never "slow": on a busy server a small artifact's only
                # chunk may come late, and refusing it then would throw the whole file away
                if (
                    have < self.size
                    and elapsed > _RATE_GRACE_S
                    and received / elapsed < self.limits.min_rate_bps
                ):
                    raise DownloadError(
                        outcomes.SLOW,
                        f"{self.url}: {received / elapsed:.0f} B/s is below the minimum",
                    )
                if self.paused():
                    return False
        if have < self.size:
            raise _Retry(f"connection closed at {have} of {self.size} bytes")
        return True

    # --- helpers -------------------------------------------------------------------------
    async def _finish(self) -> Path:
        if self._hashed == self.size:
            digest = self._digest.hexdigest()
        else:  # completed by an earlier process: nothing streamed through this one
            digest = await asyncio.to_thread(file_sha256, self.part)
        if digest != self.sha256:
            self._restart()
            raise DownloadError(
                outcomes.HASH_MISMATCH,
                f"{self.url}: SHA-256 {digest} does not match the signed {self.sha256}",
            )
        self.part.replace(self.final)
        self.meta.unlink(missing_ok=True)
        self._report(self.size, force=True)
        return self.final

    async def _wait_while_paused(self) -> None:
        while self.paused():
            await asyncio.sleep(0.5)

    def _check_space(self) -> None:
        have = self.part.stat().st_size if self.part.exists() else 0
        free = shutil.disk_usage(self.part.parent).free
        need = self.size - have + self.limits.free_space_margin_bytes
        if free < need:
            raise DownloadError(
                outcomes.NO_SPACE,
                f"{self.part.parent}: {free} bytes free, {need} needed "
                f"(artifact plus [updates] free_space_margin_bytes)",
            )

    def _restart(self) -> None:
        self.part.unlink(missing_ok=True)
        self.meta.unlink(missing_ok=True)

    def discard(self) -> None:
        """Forget the partial file (after a final failure; a crash keeps it for resuming)."""
        self._restart()

    def _validator(self) -> str | None:
        try:
            return json.loads(self.meta.read_text(encoding="utf-8")).get("validator")
        except (OSError, ValueError):
            return None

    def _save_validator(self, response: aiohttp.ClientResponse) -> None:
        """Remember the ETag (strong only) or Last-Modified for If-Range on a later resume."""
        etag = response.headers.get("ETag", "")
        validator = etag if etag and not etag.startswith("W/") else None
        validator = validator or response.headers.get("Last-Modified")
        if validator and len(validator) <= _MAX_VALIDATOR_CHARS:  # network text: bounded
            self.meta.write_text(json.dumps({"validator": validator}), encoding="utf-8")

    def _report(self, have: int, *, force: bool = False) -> None:
        now = time.monotonic()
        if self.progress is not None and (force or now - self._last_report >= 0.5):
            self._last_report = now
            self.progress(have, self.size)
