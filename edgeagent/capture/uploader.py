"""Sending sealed samples to the hub: only there, only when allowed, within the bandwidth cap.

Each round (every ``upload_interval_s``) the uploader checks the schedule window, then asks
the hub whether this device's group may upload (the hub decides; a device cannot talk itself
into it), then sends the oldest samples one at a time. A sample leaves the spool only after
the hub answered that it stored it (201) or already had it (200), so a power cut at any point
repeats at most the upload of one sample, which the hub recognises by its id: no duplicate.
The body is paced in 16 KiB chunks to ``bandwidth_bytes_per_s``. The hub's refusal of a sample
(4xx other than 401/403) deletes it, audited, since sending it again cannot succeed.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
import ssl
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp

from edgeagent.aio import cancel_and_wait, spawn
from edgeagent.capture.audit import AuditLog
from edgeagent.capture.settings import SCHEDULE_RE, CaptureSettings
from edgeagent.capture.spool import Spool
from edgeagent.fleet.samples import POLICY_PATH, RECORD_HEADER, UPLOAD_PATH, encode_record
from edgeagent.fsutil import read_secret_file
from edgeagent.models.seal_crypto import SealingError

log = logging.getLogger(__name__)
CHUNK = 16 * 1024


def in_schedule(windows: list[str], now: datetime.time) -> bool:
    """Whether ``now`` (local time) falls in one of the HH:MM-HH:MM windows (empty = always);
    a window may run past midnight (22:00-04:00)."""
    if not windows:
        return True
    minute = now.hour * 60 + now.minute
    for window in windows:
        match = SCHEDULE_RE.match(window)
        if match is None:
            continue
        h1, m1, h2, m2 = (int(g) for g in match.groups())
        start, end = h1 * 60 + m1, h2 * 60 + m2
        inside = start <= minute < end if start <= end else minute >= start or minute < end
        if inside:
            return True
    return False


class Pacer:
    """Bytes/s pacing shared by every upload of this device: a token bucket holding at most
    one second of bytes, so the gaps between samples (the hub's answer) are made up for while
    no window of T seconds carries more than rate × (T + 1 s)."""

    def __init__(self, bytes_per_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = bytes_per_s
        self._clock = clock
        self._next = clock()

    async def take(self, size: int) -> None:
        now = self._clock()
        begin = max(self._next, now - 1.0)  # the bucket's credit: one second at most
        self._next = begin + size / self.rate
        if begin > now:
            await asyncio.sleep(begin - now)  # pacing, not synchronisation: the cap is time


class Uploader:
    """The upload loop of one device (see the module docstring)."""

    def __init__(
        self,
        settings: CaptureSettings,
        spool: Spool,
        audit: AuditLog,
        *,
        now: Callable[[], datetime.time] = lambda: datetime.datetime.now().time(),
    ) -> None:
        self.settings = settings
        self.spool = spool
        self.audit = audit
        self._now = now
        self._pacer = Pacer(settings.bandwidth_bytes_per_s)
        self._task: asyncio.Task | None = None
        self._wake = asyncio.Event()
        self.uploaded = 0
        self.sent_bytes = 0
        self.last_problem = ""
        self.allowed: bool | None = None  # the hub's last answer for this device's group

    def _token(self) -> str:
        assert self.settings.token_file is not None
        return read_secret_file(self.settings.token_file).decode("utf-8").strip()

    def _ssl(self) -> ssl.SSLContext | None:
        if self.settings.ca_file is None:
            return None
        return ssl.create_default_context(cafile=str(self.settings.ca_file))

    async def start(self) -> None:
        self._task = spawn(self._loop(), name="capture-upload")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])
            self._task = None

    def wake(self) -> None:
        self._wake.set()

    async def _loop(self) -> None:
        while True:
            try:
                await self.run_once()
            except Exception as exc:
                self.last_problem = str(exc)
                log.warning("capture upload round failed: %s", exc)
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.settings.upload_interval_s)

    async def run_once(self, limit: int | None = None) -> int:
        """One round: every pending sample (at most ``limit``) if the window and the hub allow;
        the number the hub accepted."""
        if not in_schedule(self.settings.schedule, self._now()):
            self.last_problem = "outside the upload schedule"
            return 0
        headers = {"Authorization": f"Bearer {self._token()}"}
        base = self.settings.hub_url.rstrip("/")
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=60)
        async with aiohttp.ClientSession(headers=headers, timeout=timeout) as http:
            async with http.get(base + POLICY_PATH, ssl=self._ssl()) as answer:
                policy = await answer.json(content_type=None)
                if answer.status != 200:
                    raise RuntimeError(f"hub policy: HTTP {answer.status}: {policy}")
            self.allowed = bool(policy.get("upload"))
            if not self.allowed:
                self.last_problem = "the hub does not take samples from this device's group"
                return 0
            done = 0
            for sample_id in self.spool.ids()[:limit]:
                if await self._send(http, base, sample_id):
                    done += 1
            self.last_problem = ""
            return done

    async def _send(self, http: aiohttp.ClientSession, base: str, sample_id: str) -> bool:
        try:
            sample = self.spool.read(sample_id)
        except (SealingError, ValueError) as exc:
            self.spool.delete(sample_id)
            self.audit.record("deleted", id=sample_id, reason=f"unreadable: {exc}")
            return False
        except FileNotFoundError:
            return False  # purged meanwhile
        url = base + UPLOAD_PATH.format(sample_id=sample_id)
        headers = {RECORD_HEADER: encode_record(sample.record), "Content-Type": "image/jpeg"}
        async with http.put(
            url, data=self._paced(sample.image), headers=headers, ssl=self._ssl()
        ) as answer:
            body: Any = await answer.json(content_type=None)
            status = answer.status
        if status in (200, 201):
            self.spool.delete(sample_id)
            self.uploaded += 1
            self.audit.record(
                "uploaded",
                id=sample_id,
                model=sample.record.get("model"),
                version=sample.record.get("version"),
                stored=body.get("stored"),
            )
            return True
        if status in (401, 403, 429) or status >= 500:
            raise RuntimeError(f"hub refused the upload: HTTP {status}: {body}")
        self.spool.delete(sample_id)
        self.audit.record("deleted", id=sample_id, reason=f"hub refused: HTTP {status}: {body}")
        return False

    async def _paced(self, data: bytes) -> AsyncIterator[bytes]:
        for offset in range(0, len(data), CHUNK):
            chunk = data[offset : offset + CHUNK]
            await self._pacer.take(len(chunk))
            self.sent_bytes += len(chunk)
            yield chunk

    def status(self) -> dict[str, Any]:
        return {
            "uploaded": self.uploaded,
            "sent_bytes": self.sent_bytes,
            "group_allowed": self.allowed,
            "problem": self.last_problem,
        }
