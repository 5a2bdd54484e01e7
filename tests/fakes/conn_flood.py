"""A connection flood from one loopback source address, for the gateway's per-client bound.

Shared by ``tests/integration/test_gateway_bounds.py`` (bounded, short) and the
``tests/bench/hostile.py persist`` driver (the 30 s figures in ``docs/reliability.md``).
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
from collections import Counter


def connect_from(source: str, port: int) -> socket.socket:
    """A connection from ``source`` (another loopback address: Linux routes 127.0.0.0/8 to lo)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(20)
    try:
        sock.bind((source, 0))
        sock.connect(("127.0.0.1", port))
    except OSError:
        sock.close()
        raise
    return sock


class Flood(threading.Thread):
    """One source address holding ``sockets`` connections to the gateway, each re-opened as soon as
    the gateway closes it (within 50 ms), until ``stop``: each sends a request line and one header,
    never the end of its headers (a served one is held until the header timeout). Records what
    came back."""

    def __init__(self, port: int, sockets: int, max_opens: int, source: str = "127.0.0.1") -> None:
        super().__init__(daemon=True)
        self.port, self.sockets, self.max_opens, self.source = port, sockets, max_opens, source
        self.connect_failures = 0
        self.stop = threading.Event()
        self.answers: Counter[bytes] = Counter()
        self.opens = 0
        self.retry_after_missing = 0

    def open(self, selector: selectors.BaseSelector) -> None:
        try:
            sock = connect_from(self.source, self.port)
        except OSError:
            self.connect_failures += 1
            return
        sock.setblocking(False)
        with contextlib.suppress(OSError):
            sock.send(b"GET /health HTTP/1.1\r\nhost: flood\r\n")
        selector.register(sock, selectors.EVENT_READ)
        self.opens += 1

    def run(self) -> None:
        with selectors.DefaultSelector() as selector:
            try:
                for _ in range(self.sockets):
                    self.open(selector)
                while not self.stop.is_set() and self.opens < self.max_opens:
                    for key, _ in selector.select(timeout=0.1):
                        sock = key.fileobj
                        assert isinstance(sock, socket.socket)
                        try:
                            answer = sock.recv(65536)
                        except OSError:
                            answer = b""
                        self.answers[answer[:12]] += 1
                        if answer.startswith(b"HTTP/1.1 503") and b"retry-after:" not in answer.lower():
                            self.retry_after_missing += 1
                        selector.unregister(sock)
                        sock.close()
                        self.open(selector)  # at once
                    self.stop.wait(0.05)  # (a bound on the CPU the refused ones' cycle takes)
            finally:
                for key in list(selector.get_map().values()):
                    key.fileobj.close()  # type: ignore[union-attr]
