"""Who holds a loopback TCP port: the one proof of identity a local TCP listener gives.

A bearer token sent to ``http://127.0.0.1:PORT`` goes to whatever process listens there, and
with the agent stopped or restarting any local user may bind the port first. On Linux the
kernel's socket tables (``/proc/net/tcp``, ``tcp6``) name the owner of every listening socket,
so a client can see before it connects whether the port is held by root, by itself, or by the
agent's user — or by somebody else, who gets no token. Elsewhere (no such tables) nothing can
be proved, and the caller falls back to sending the least-privileged token.
"""

from __future__ import annotations

import ipaddress
import sys
from pathlib import Path

TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
LISTEN = "0A"  # TCP_LISTEN, as the tables print a socket's state


def _address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """The tables' address: 32-bit words in hex, each in the host's byte order."""
    words = [hex_address[i : i + 8] for i in range(0, len(hex_address), 8)]
    raw = b"".join(int(word, 16).to_bytes(4, sys.byteorder) for word in words)
    return ipaddress.ip_address(raw)


def listener_uids(port: int, tables: tuple[Path, ...] = TABLES) -> set[int] | None:
    """The uids owning sockets that listen on ``port`` where loopback connections reach them
    (a loopback or wildcard address); None where no table can be read (not Linux)."""
    found: set[int] = set()
    readable = False
    for table in tables:
        try:
            lines = table.read_text(encoding="ascii").splitlines()[1:]
        except OSError:
            continue
        readable = True
        for line in lines:
            fields = line.split()
            if len(fields) < 8 or fields[3] != LISTEN:
                continue
            hex_address, _, hex_port = fields[1].rpartition(":")
            try:
                address, owner = _address(hex_address), int(fields[7])
                if int(hex_port, 16) != port:
                    continue
            except ValueError:
                continue
            mapped = getattr(address, "ipv4_mapped", None) or address
            if mapped.is_loopback or mapped.is_unspecified:
                found.add(owner)
    return found if readable else None
