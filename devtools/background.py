"""Background tasks of a benchmark that cannot die unnoticed.

A bench's helpers (a recorder sampling the run, an event listener, request tasks fired
open-loop) run beside its main coroutine. When one of them raised, asyncio only logs "Task
exception was never retrieved" at garbage collection, if ever, and the bench would go on to print
figures from a run that measured nothing (a dead recorder reads as "run too short to settle").
Here the first death stops the bench at once: its main task is cancelled, and
leaving the block raises ``BackgroundTaskDied`` chained to the task's own exception, so the
traceback is printed and the process exits non-zero.

``asyncio.TaskGroup`` does this on Python 3.11 but the project supports 3.10, and a bench's
tasks are mostly loops that run until it stops them, which a TaskGroup would wait for.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, TypeVar

from edgeagent.aio import cancel_and_wait

T = TypeVar("T")

log = logging.getLogger(__name__)


class BackgroundTaskDied(RuntimeError):
    """A bench's background task raised; ``__cause__`` is its exception."""


class WatchedTasks:
    """``async with WatchedTasks() as tasks: tasks.spawn(coro, name)``.

    Leaving the block cancels the tasks still running and waits for them: a bench's helpers
    live as long as its measurement, no longer. A task that raised, before or during that,
    makes the block raise ``BackgroundTaskDied``.
    """

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()
        self._owner: asyncio.Task[Any] | None = None
        self._died: asyncio.Task[Any] | None = None
        self._cancelled_owner = False

    async def __aenter__(self) -> WatchedTasks:
        self._owner = asyncio.current_task()
        return self

    def spawn(self, coro: Coroutine[Any, Any, T], name: str | None = None) -> asyncio.Task[T]:
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        return task

    def _finished(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled() or task.exception() is None or self._died is not None:
            return
        self._died = task
        log.error("background task %s died: %r; stopping", task.get_name(), task.exception())
        if self._owner is not None:  # None once the block is being left: it raises then
            self._owner.cancel()
            self._cancelled_owner = True

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        owner, self._owner = self._owner, None
        await cancel_and_wait(list(self._tasks))  # repeats a cancel that a library lost
        if self._died is None:
            return
        if self._cancelled_owner and owner is not None and hasattr(owner, "uncancel"):
            owner.uncancel()  # Python 3.11+: the cancel was ours, and is answered by the raise
        cause = self._died.exception()
        raise BackgroundTaskDied(f"background task {self._died.get_name()} died: {cause!r}") from (
            cause
        )
