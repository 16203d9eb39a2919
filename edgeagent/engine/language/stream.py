"""One generation as the transports see it: an async iterator of text chunks, and aclose().

The scheduler's loop puts chunks in, the handler takes them out; both run on the event loop,
so a plain asyncio queue joins them. ``aclose()`` (a client gone, a handler cancelled) only
marks the sequence and wakes the scheduler, which frees its KV cache in its next step.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

from edgeagent.engine.text_requests import TextChunk, Usage

_END = object()


class GenerationStream:
    """A ``text_requests.Generation``: chunks in order, then the end (or the error)."""

    def __init__(self, wake: Callable[[], None]) -> None:
        self.finish_reason: str | None = None
        self.usage: Usage | None = None
        self.cancelled = False
        self.admitted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        self._wake = wake
        self._ended = False

    # ---- the scheduler's side ---------------------------------------------------------------

    def put(self, chunk: TextChunk) -> None:
        if not self._ended:
            self._queue.put_nowait(chunk)

    def end(self, reason: str | None, usage: Usage | None) -> None:
        if not self._ended:
            self.finish_reason, self.usage, self._ended = reason, usage, True
            self._queue.put_nowait(_END)

    def fail(self, error: BaseException) -> None:
        """Before admission: ``generate`` raises it; after: the iterator does."""
        if not self.admitted.done():
            self.admitted.set_exception(error)
            self.admitted.exception()  # retrieved here: the caller may be gone already
        if not self._ended:
            self._ended = True
            self._queue.put_nowait(error)

    @property
    def ended(self) -> bool:
        return self._ended

    # ---- the transport's side ---------------------------------------------------------------

    def __aiter__(self) -> AsyncIterator[TextChunk]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[TextChunk]:
        while True:
            item = await self._queue.get()
            if item is _END:
                return
            if isinstance(item, BaseException):
                raise item
            assert isinstance(item, TextChunk)
            yield item

    async def aclose(self) -> None:
        """Stop generating; the sequence's KV cache is freed in the scheduler's next step."""
        if not self._ended:
            self.cancelled = True
            self._wake()
