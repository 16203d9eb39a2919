"""Small asyncio helpers shared by the agent's long-running services."""

from __future__ import annotations

import asyncio
import importlib.util
import logging
from collections.abc import Coroutine, Iterable
from typing import Any, TypeVar

T = TypeVar("T")

log = logging.getLogger(__name__)

# The loop holds tasks only weakly: a task nobody references can be collected mid-run.
_running: set[asyncio.Task[Any]] = set()


def spawn(coro: Coroutine[Any, Any, T], *, name: str) -> asyncio.Task[T]:
    """Start a background task whose death is logged, with its traceback, when it happens.

    A task that raises keeps its exception until someone awaits it; one kept in a list and
    cancelled at shutdown never is, so it dies in silence (a bench whose
    recorder died on an AttributeError reports only a run "too short" to measure). The task is
    held here until it ends; an owner may still keep, cancel or await it (awaiting re-raises
    the same exception). Cancellation is how background tasks are stopped, so it is not logged.
    """
    task = asyncio.get_running_loop().create_task(coro, name=name)
    _running.add(task)
    task.add_done_callback(_ended)
    return task


def _ended(task: asyncio.Task[Any]) -> None:
    _running.discard(task)
    if task.cancelled():
        return
    error = task.exception()
    if error is not None:
        log.error("background task %s died", task.get_name(), exc_info=error)


async def cancel_and_wait(
    tasks: Iterable[asyncio.Task], timeout_s: float = 10.0, *, recancel_s: float = 0.5
) -> None:
    """Cancel background tasks and wait for them, but never longer than ``timeout_s``.

    One ``cancel()`` is not always enough on Python 3.11: ``asyncio.wait_for`` swallows the
    cancellation when its inner future completes in the same loop pass (gh-86296, fixed in
    3.12), and aiomqtt awaits every acknowledgement through it, so a client cancelled while a
    SUBACK arrives carries on serving. Tasks still running are cancelled again every
    ``recancel_s``, else such a client keeps a shutdown (the hub server's) waiting forever.

    A shutdown that hangs is worse than one that abandons a stuck task: systemd would kill the
    process mid-drain. A task still running after the time-out (a library awaiting a peer that
    will never answer) is cancelled once more and left behind, with an error naming it.
    """
    pending = {task for task in tasks if not task.done()}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while pending:
        for task in pending:
            task.cancel()
        left = deadline - loop.time()
        if left <= 0:
            break
        _, pending = await asyncio.wait(pending, timeout=min(recancel_s, left))
    for task in pending:
        log.error("task %s did not stop within %g s; abandoned", task.get_name(), timeout_s)


def uvloop_installed() -> bool:
    return importlib.util.find_spec("uvloop") is not None


def run(main: Coroutine[Any, Any, T], event_loop: str = "auto") -> T:
    """``asyncio.run`` on the chosen loop: ``uvloop`` (the [uvloop] extra), ``asyncio``, or
    ``auto`` (uvloop where installed).

    uvloop's loop and sockets are C: each request's trips round the loop cost less CPU, which
    on a 2-core board the runtime's threads get instead; it adds ~2 MB resident.
    Not the default: uvloop duplicates each socket it is given, so every admitted connection
    holds two descriptors and a connection flood reaches the open-file limit twice as soon.
    """
    if event_loop == "uvloop" or (event_loop == "auto" and uvloop_installed()):
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)
