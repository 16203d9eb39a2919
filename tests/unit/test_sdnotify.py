"""The notify protocol against real datagram sockets (path and abstract), as systemd reads it."""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from pathlib import Path

import pytest

from edgeagent.sdnotify import Notifier


@pytest.fixture
def path_socket(tmp_path: Path):
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = tmp_path / "notify"
    sock.bind(str(path))
    sock.settimeout(5)
    yield str(path), sock
    sock.close()


def receive(sock: socket.socket) -> dict[str, str]:
    data = sock.recv(4096).decode()
    return dict(line.split("=", 1) for line in data.splitlines())


def test_ready_status_stopping_on_a_path_socket(path_socket):
    path, sock = path_socket
    notifier = Notifier({"NOTIFY_SOCKET": path})
    assert notifier.ready("serving 2 models")
    assert receive(sock) == {
        "READY": "1",
        "MAINPID": str(os.getpid()),
        "STATUS": "serving 2 models",
    }
    assert notifier.status("loading tiny")
    assert receive(sock) == {"STATUS": "loading tiny"}
    assert notifier.stopping()
    assert receive(sock) == {"STOPPING": "1", "STATUS": "draining"}


def test_abstract_socket_name():
    name = f"edgeagent-test-{uuid.uuid4().hex}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(b"\0" + name.encode())
    sock.settimeout(5)
    try:
        assert Notifier({"NOTIFY_SOCKET": "@" + name}).watchdog()
        assert receive(sock) == {"WATCHDOG": "1"}
    finally:
        sock.close()


def test_without_a_manager_everything_is_a_no_op():
    notifier = Notifier({})
    assert not notifier.enabled and not notifier.ready() and notifier.watchdog_interval_s is None


def test_vanished_socket_is_reported_not_raised(tmp_path: Path, caplog):
    notifier = Notifier({"NOTIFY_SOCKET": str(tmp_path / "gone")})
    assert notifier.ready() is False
    assert "sd_notify" in caplog.text


@pytest.mark.parametrize(
    ("env", "interval"),
    [
        ({"WATCHDOG_USEC": "4000000"}, 2.0),
        ({"WATCHDOG_USEC": "4000000", "WATCHDOG_PID": "1"}, None),  # meant for another process
        ({"WATCHDOG_USEC": "nonsense"}, None),
        ({"WATCHDOG_USEC": "0"}, None),
    ],
)
def test_watchdog_interval_is_half_of_watchdog_usec(env, interval):
    assert Notifier(env).watchdog_interval_s == interval


async def test_watchdog_loop_pings_at_half_the_interval(path_socket):
    path, sock = path_socket
    env = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "100000", "WATCHDOG_PID": str(os.getpid())}
    notifier = Notifier(env)
    assert notifier.watchdog_interval_s == 0.05
    task = asyncio.create_task(notifier.watchdog_loop())
    try:
        for _ in range(2):  # the socket's 5 s time-out bounds each wait
            assert await asyncio.to_thread(receive, sock) == {"WATCHDOG": "1"}
    finally:
        task.cancel()
