"""Which listen addresses are private to this machine."""

from __future__ import annotations

import ipaddress
import socket


def is_loopback(host: str) -> bool:
    """True when ``host`` (a name or an address) only ever means this machine: 127.0.0.0/8, ::1, localhost."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:  # a host name: loopback only if every address it resolves to is
        addresses = {str(info[4][0]) for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    return bool(addresses) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses)
