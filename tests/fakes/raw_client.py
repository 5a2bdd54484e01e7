"""A raw HTTP/1.1 client over a socket: it can hang up at any moment, even while queued."""

from __future__ import annotations

import json
import socket
import time
from typing import Any

__all__ = ["RawClient"]


class RawClient:
    def __init__(
        self,
        port: int,
        path: str,
        body: dict[str, Any],
        headers: dict[str, str] | None = None,
        *,
        receive_buffer: int | None = None,
    ) -> None:
        """``receive_buffer``: a small socket receive buffer, for a client that stops reading."""
        payload = json.dumps(body).encode()
        lines = [
            f"POST {path} HTTP/1.1",
            "host: 127.0.0.1",
            "content-type: application/json",
            f"content-length: {len(payload)}",
        ]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if receive_buffer is not None:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        self.sock.settimeout(10)
        self.sock.connect(("127.0.0.1", port))
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + payload)
        self.received = b""

    def read_until(self, marker: bytes, timeout: float = 10.0) -> bytes:
        """Read until ``marker`` has arrived (AssertionError after ``timeout``)."""
        deadline = time.monotonic() + timeout
        while marker not in self.received:
            left = deadline - time.monotonic()
            assert left > 0, f"{marker!r} not received; got {self.received[-200:]!r}"
            self.sock.settimeout(left)
            chunk = self.sock.recv(65536)
            assert chunk, f"connection closed before {marker!r}; got {self.received[-200:]!r}"
            self.received += chunk
        return self.received

    def status(self) -> int:
        head = self.read_until(b"\r\n\r\n")
        return int(head.split(b" ", 2)[1])

    def close(self) -> None:
        self.sock.close()
