"""The test broker survives a port that another process took between choosing and binding it."""

from __future__ import annotations

import socket
from pathlib import Path

from devtools.broker import Broker


def test_a_port_taken_before_the_first_start_is_replaced(tmp_path: Path) -> None:
    broker = Broker(tmp_path / "broker")
    taken = broker.port
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        broker.start()
        try:
            assert broker.port != taken
            assert f"listener {broker.port} 127.0.0.1" in broker.config.read_text()
            with socket.create_connection(("127.0.0.1", broker.port), timeout=2):
                pass
            broker.restart()  # once started, the ports stay what clients were told
            assert broker.port != taken
            with socket.create_connection(("127.0.0.1", broker.port), timeout=2):
                pass
        finally:
            broker.stop()
