"""Connection limits of the gateway's HTTP server, enforced before a request reaches the app.

uvicorn (0.54) bounds idle keep-alive connections (``timeout_keep_alive``) but not the rest: with
httptools it has no header size or count limit and no header-read timeout, and its
``limit_concurrency`` answers 503 to requests while every idle connection still holds a file
descriptor. An ASGI middleware cannot help: it runs only once the headers are parsed, buffered
whole. So :func:`bounded_protocol` subclasses uvicorn's httptools protocol (its parser callbacks
are the one place that sees bytes before a request exists) and adds:

- ``max_connections``: a connection past it is closed as soon as it is accepted (held below the
  descriptor limit, so a flood meets this refusal, not a failing ``accept``);
- ``header_timeout_s``: the request line and headers must arrive within it (from the connection, or
  from a kept-alive request's first byte); otherwise the connection is closed;
- ``max_header_bytes`` and ``max_headers``: past either, ``431`` and the connection is closed.

The bytes are counted per read (uvloop reads at most 256 KiB), so no more than one read past the
limit is ever buffered.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from dataclasses import dataclass
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from sparkfold.config import ApiSettings

__all__ = ["ConnectionLimits", "bounded_protocol"]

log = logging.getLogger(__name__)

FD_RESERVE = 128
"""Descriptors kept for what is not a client: engine connections, logs, the listening socket."""


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int
    header_timeout_s: float
    max_header_bytes: int
    max_headers: int

    @classmethod
    def of(cls, api: ApiSettings) -> ConnectionLimits:
        """From the settings; ``max_connections`` held below the process's descriptor limit, so
        a flood is refused by the gateway instead of failing ``accept`` for everyone."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        usable = api.max_connections if soft == resource.RLIM_INFINITY else max(1, soft - FD_RESERVE)
        if usable < api.max_connections:
            log.warning(
                "api.max_connections lowered to fit the descriptor limit (raise LimitNOFILE)",
                extra={"max_connections": usable, "nofile": soft},
            )
        return cls(
            max_connections=min(api.max_connections, usable),
            header_timeout_s=api.header_timeout_s,
            max_header_bytes=api.max_header_kib * 1024,
            max_headers=api.max_headers,
        )


def _431(reason: str) -> bytes:
    body = f"{reason}; send a smaller request\n".encode()
    return (
        b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; charset=utf-8\r\n"
        + b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body)
        + body
    )


class _RefusedConnections:
    """Counts connections closed at ``max_connections``; logs one line per ``every_s`` at most."""

    def __init__(self, every_s: float = 10.0) -> None:
        self.every_s = every_s
        self.count = 0
        self._logged_at = -every_s
        self._since = 0

    def note(self, open_now: int) -> None:
        self.count += 1
        self._since += 1
        now = time.monotonic()
        if now - self._logged_at >= self.every_s:
            log.warning(
                "connections refused: api.max_connections reached",
                extra={"open": open_now, "refused": self._since},
            )
            self._logged_at, self._since = now, 0


_refused = _RefusedConnections()


class _BoundedProtocol(HttpToolsProtocol):
    limits: ConnectionLimits

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._reading_headers = True
        self._header_bytes = 0
        self._header_count = 0
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            _refused.note(len(self.connections))
            transport.close()
            return
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._reading_headers:
            self._header_bytes += len(data)
            if self._header_timer is None:
                self._arm_header_timer()
        super().data_received(data)
        if not self._reading_headers or self.transport.is_closing():
            return
        if self._header_count > self.limits.max_headers:
            self._refuse(f"more than {self.limits.max_headers} header fields")
        elif self._header_bytes > self.limits.max_header_bytes:
            self._refuse(f"request line and headers past {self.limits.max_header_bytes // 1024} KiB")

    def _over_limits(self) -> bool:
        # bytes are judged after the read (headers still incomplete past the limit): a read that
        # completes the headers may carry body bytes too, which are not header bytes
        return self._header_count > self.limits.max_headers

    def on_header(self, name: bytes, value: bytes) -> None:
        self._header_count += 1
        if self._header_count <= self.limits.max_headers:
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        if self._over_limits():
            return  # refused once this read is parsed (data_received), never run
        self._reading_headers = False
        self._disarm_header_timer()
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._reading_headers:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._reading_headers:  # a refused request: nothing of it ran
            return
        super().on_message_complete()
        self._reading_headers = True
        self._header_bytes = 0
        self._header_count = 0

    def _refuse(self, reason: str) -> None:
        log.info("request refused before its headers were read", extra={"reason": reason})
        self._disarm_header_timer()
        self.transport.write(_431(reason))
        self.transport.close()

    def _arm_header_timer(self) -> None:
        self._disarm_header_timer()
        self._header_timer = self.loop.call_later(self.limits.header_timeout_s, self._header_timeout)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timeout(self) -> None:
        self._header_timer = None
        if self._reading_headers and not self.transport.is_closing():
            self.transport.close()


def bounded_protocol(limits: ConnectionLimits) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol class with ``limits`` (pass it as ``uvicorn.Config(http=...)``)."""
    return type("BoundedHttpProtocol", (_BoundedProtocol,), {"limits": limits})
