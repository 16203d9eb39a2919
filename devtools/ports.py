"""A free loopback TCP port, for the test and benchmark servers that need a number up front.

The port is free when chosen and may be taken before the caller binds it; callers that start a
process on it (the broker, a daemon) retry with another one when that race is lost.
"""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listened on a moment ago."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
