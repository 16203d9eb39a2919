"""A background task of the running daemon that dies is logged with its traceback."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from devtools.waiting import until
from edgeagent.config import parse_config
from edgeagent.daemon import Daemon
from tests.support.helpers import write_tiny_package


class WatchdogBroke(RuntimeError):
    pass


async def test_the_daemon_logs_its_watchdog_task_dying(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_tiny_package(tmp_path / "models" / "tiny", seed=1)
    daemon = Daemon(
        parse_config(
            f"[agent]\nstate_dir = '{tmp_path / 'state'}'\n"
            f"models_dir = '{tmp_path / 'models'}'\n"
            f"[server]\nunix_socket = '{tmp_path / 'agent.sock'}'\ntcp_port = 0\n"
        )
    )

    async def broken_watchdog() -> None:
        raise WatchdogBroke("sd_notify socket vanished")

    daemon.notifier.watchdog_loop = broken_watchdog  # type: ignore[method-assign]
    died = "background task watchdog died"
    with caplog.at_level(logging.ERROR, logger="edgeagent.aio"):
        await daemon.start()
        try:
            await until(lambda: died in caplog.text)
        finally:
            await daemon.stop()
    [record] = [r for r in caplog.records if r.getMessage() == died]
    assert record.exc_info is not None and record.exc_info[0] is WatchdogBroke
    assert "in broken_watchdog" in caplog.text
