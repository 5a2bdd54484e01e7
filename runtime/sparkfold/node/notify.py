"""sd_notify: tell systemd about readiness, status, watchdog and shutdown.

A datagram to ``$NOTIFY_SOCKET`` (a path, or ``@name`` for the abstract namespace); without
the variable every call does nothing, so the same code runs under systemd and in a shell.
"""

from __future__ import annotations

import os
import socket

__all__ = ["notify", "watchdog_interval_s"]


def notify(*states: str) -> bool:
    """Send ``READY=1``, ``STATUS=…``, ``WATCHDOG=1``, ``STOPPING=1``, ``MAINPID=…``; True if sent."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address or not states:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall("\n".join(states).encode())
    except OSError:
        return False
    return True


def watchdog_interval_s() -> float | None:
    """Half of systemd's ``WatchdogSec`` (``$WATCHDOG_USEC``) when it is meant for this process."""
    usec = os.environ.get("WATCHDOG_USEC")
    pid = os.environ.get("WATCHDOG_PID")
    if not usec or (pid and pid != str(os.getpid())):
        return None
    return int(usec) / 2e6
