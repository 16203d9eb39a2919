"""The acceptor under a flood that is already queued when it starts: the worst case for the
descriptors, since every connection is ready to accept in one wake-up.

The server runs in a child process whose open-file limit leaves room for the cap plus one
connection being refused, and nothing more: asyncio's own accept loop (a hundred accepts
before the first refusal is closed) ran out of descriptors here; the acceptor must not.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

CAP = 5
FLOOD = 150
BOUND_S = 60

SERVER = textwrap.dedent(
    f"""
    import asyncio, json, os, resource, sys
    from edgeagent.api.acceptor import Acceptor, ConnectionCap, tcp_sockets

    async def main():
        [sock] = await tcp_sockets("127.0.0.1", 0, {FLOOD * 2})
        print(sock.getsockname()[1], flush=True)
        sys.stdin.readline()  # the flood is queued in the kernel
        errors = []
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda _, context: errors.append(context["message"]))
        used = len(os.listdir("/proc/self/fd")) - 1  # less the listing's own descriptor
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (used + {CAP} + 1, hard))
        cap = ConnectionCap({CAP})

        acceptor = Acceptor([sock], asyncio.Protocol, cap, b"busy\\n")  # holds each
        await acceptor.start_serving()
        for _ in range(1000):  # bounded: each turn is one loop wake-up or more
            if cap.open + cap.refused >= {FLOOD}:
                break
            await asyncio.sleep(0.01)
        acceptor.close()
        print(json.dumps({{"open": cap.open, "refused": cap.refused, "errors": errors}}))

    asyncio.run(main())
    """
)


def test_a_queued_flood_is_refused_within_the_cap_plus_one_descriptor() -> None:
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert server.stdin is not None and server.stdout is not None
    clients: list[socket.socket] = []
    try:
        port = int(server.stdout.readline())
        clients = [socket.create_connection(("127.0.0.1", port), BOUND_S) for _ in range(FLOOD)]
        server.stdin.write("go\n")
        server.stdin.flush()
        outcome = json.loads(server.stdout.readline())
        answers = [client.recv(16) for client in clients[CAP:]]
    finally:
        for client in clients:
            client.close()
        _, stderr = server.communicate(timeout=BOUND_S)
    assert outcome == {"open": CAP, "refused": FLOOD - CAP, "errors": []}, stderr
    assert set(answers) == {b"busy\n"}
    assert "cannot accept" not in stderr, stderr
