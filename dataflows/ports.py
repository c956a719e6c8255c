"""Free loopback ports, for the broker, the metrics endpoint and worker processes started here."""

from __future__ import annotations

import socket


def free_ports(n: int) -> list[int]:
    """``n`` distinct loopback ports free right now (the OS picks them; all held until all are picked)."""
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def free_port() -> int:
    """One free loopback port."""
    return free_ports(1)[0]
