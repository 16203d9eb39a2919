"""Which listen addresses never leave the machine: shared by the agent's and the hub's listeners,
whose token rules both relax only for loopback."""

from __future__ import annotations

import ipaddress


def is_loopback(host: str) -> bool:
    """True for names and addresses that never leave the machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
