"""The pieces behind the listener limits, on their own: the byte budget, the quiet loop error
handler, and the [server] keys that configure them."""

from __future__ import annotations

import asyncio
import logging

import pytest

from edgeagent.api.listeners import QuietLoopErrors
from edgeagent.api.settings import ServerSettings
from edgeagent.config import parse_config
from edgeagent.engine.budget import Budget, Busy
from edgeagent.sections import ConfigError


async def test_budget_serves_in_arrival_order_and_never_splits_a_reservation() -> None:
    budget = Budget(100)
    order: list[str] = []
    first = budget.hold(80, 10)
    await first.__aenter__()

    async def take(name: str, nbytes: int) -> None:
        async with budget.hold(nbytes, 10):
            order.append(name)

    big = asyncio.create_task(take("big", 60))
    small = asyncio.create_task(take("small", 10))  # fits now, but waits its turn behind big
    await asyncio.sleep(0)
    assert order == [] and budget.free == 20
    await first.__aexit__(None, None, None)
    await asyncio.gather(big, small)
    assert order == ["big", "small"] and budget.free == 100


async def test_budget_refuses_after_the_wait_and_gives_back_what_it_held() -> None:
    budget = Budget(10)
    async with budget.hold(10, 1):
        with pytest.raises(Busy) as caught:
            async with budget.hold(1, 0.01):
                pass
        assert caught.value.status == 503 and caught.value.retry_after == 1
    assert budget.free == 10


async def test_budget_clamps_a_request_larger_than_itself() -> None:
    budget = Budget(10)
    async with budget.hold(10**9, 0.01):
        assert budget.free == 0
    assert budget.free == 10


async def test_a_cancelled_waiter_leaves_the_queue() -> None:
    budget = Budget(10)
    async with budget.hold(10, 1):
        waiter = asyncio.create_task(budget.hold(5, 10).__aenter__())
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
    assert budget.free == 10
    async with budget.hold(10, 0.01):  # nothing left queued in front
        pass


def test_loop_errors_are_logged_once_per_period_with_a_count(caplog) -> None:
    now = [0.0]
    handler = QuietLoopErrors(every_s=10, clock=lambda: now[0])
    loop = asyncio.new_event_loop()
    context = {"message": "socket.accept() out of system resource", "exception": OSError(24, "x")}
    with caplog.at_level(logging.ERROR, "edgeagent.api.listeners"):
        for _ in range(1000):
            handler(loop, context)
        now[0] = 11.0
        handler(loop, context)
        handler(loop, {"message": "another kind"})
    loop.close()
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 3
    assert "999 more like it" in messages[1] and "another kind" in messages[2]


@pytest.mark.parametrize(
    ("table", "fragment"),
    [
        ("token = 'same'\nadmin_token = 'same'", "[server] admin_token: must differ"),
        ("token = 'tök'", "[server] token: must be visible ASCII"),
        ("tcp_host = '0.0.0.0'\ntoken = 'x'\ntcp_auth = 'none'", "[server] tcp_auth: 'none'"),
        ("tcp_auth = 'open'", "[server] tcp_auth: must be one of"),
        ("max_connections = 0", "[server] max_connections"),
        ("header_timeout_s = 0", "[server] header_timeout_s"),
        ("send_timeout_s = -1", "[server] send_timeout_s"),
        ("body_min_bytes_per_s = 0", "[server] body_min_bytes_per_s"),
        ("max_body_bytes = 100\nmax_decoding_bytes = 99", "[server] max_decoding_bytes"),
    ],
)
def test_bad_listener_settings_are_refused_by_name(table: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(f"[server]\n{table}\n")
    assert fragment in str(caught.value)


def test_the_defaults_need_a_token_on_tcp() -> None:
    settings = ServerSettings()
    assert settings.tcp_auth == "token" and settings.max_connections > 0
