"""Connection limits of the gateway's HTTP server, enforced before a request reaches the app.

uvicorn (0.54) bounds idle keep-alive connections (``timeout_keep_alive``) but not the rest: with
httptools it has no header size or count limit and no header-read timeout, and its
``limit_concurrency`` answers 503 to requests while every idle connection still holds a file
descriptor. An ASGI middleware cannot help: it runs only once the headers are parsed, buffered
whole. So :func:`bounded_protocol` subclasses uvicorn's httptools protocol (its parser callbacks
are the one place that sees bytes before a request exists) and adds:

- ``max_connections``: the connections served at once (held below the descriptor limit, so a
  flood meets this refusal, not a failing ``accept``);
- ``max_connections_per_client``: the connections one source address may hold (an IPv6 client is
  counted by its /64), at most three quarters of ``max_connections``: one client re-opening
  silent connections as fast as they are closed never takes the rest from the others (nginx's
  ``limit_conn`` on ``$binary_remote_addr``, HAProxy's ``src_conn_cur``, as a default);
- ``header_timeout_s``: the request line and headers must arrive within it (from the connection, or
  from a kept-alive request's first byte); otherwise the connection is closed;
- ``max_header_bytes`` and ``max_headers``: past either, ``431`` and the connection is closed.

A connection past either cap is refused: it waits at most ``REFUSAL_WAIT_S`` for its request
line, answered ``503`` with ``Retry-After`` (in the dialect its path asks for) when the line
comes, closed without a word when it does not. At most ``MAX_REFUSING`` refusals wait at once
(inside the descriptors kept free, ``FD_RESERVE``); past that a refused connection is closed at
accept.

The bytes are counted per read (uvloop reads at most 256 KiB), so no more than one read past the
limit is ever buffered.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import resource
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from sparkfold.api.errors import RETRY_AFTER_S, ApiError, error_bytes, is_anthropic_path
from sparkfold.config import ApiSettings

__all__ = ["ConnectionLimits", "bounded_protocol", "client_of"]

log = logging.getLogger(__name__)

FD_RESERVE = 128
"""Descriptors kept for what is not a served client: engine connections, logs, the listening
socket, refusals waiting for their request line."""
MAX_REFUSING = 32
"""Refused connections waiting for their request line at once (the rest are closed at accept)."""
REFUSAL_WAIT_S = 1.0
"""How long a refused connection may take to send its request line (a client sends it at once)."""
MAX_REQUEST_LINE = 8192
"""Bytes read from a refused connection to find its request line."""


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int
    max_connections_per_client: int
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
        max_connections = min(api.max_connections, usable)
        per_client = max_connections  # at or past max_connections: no per-client cap (behind a proxy)
        if api.max_connections_per_client < api.max_connections:
            per_client = min(api.max_connections_per_client, max(1, max_connections * 3 // 4))
        return cls(
            max_connections=max_connections,
            max_connections_per_client=per_client,
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


class TooManyConnections(ApiError):
    status = 503
    type = "overloaded_error"

    def __init__(self, cap: str) -> None:
        super().__init__(f"too many connections ({cap}); retry shortly", code="too_many_connections")


def _503(request_line: bytes, cap: str) -> bytes:
    """The answer to a refused connection whose request line (``METHOD PATH VERSION``) came."""
    parts = request_line.split(b" ")
    path = parts[1].decode("latin-1") if len(parts) > 1 else ""
    body = error_bytes(TooManyConnections(cap), anthropic=is_anthropic_path(path))
    return (
        b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
        + b"retry-after: %d\r\ncontent-length: %d\r\nconnection: close\r\n\r\n" % (RETRY_AFTER_S, len(body))
        + body
    )


def client_of(peer: object) -> str:
    """The key a connection is counted under: its source address (an IPv6 one by its /64, the
    block one host is given; an IPv4-mapped one as IPv4); ``""`` when there is none (a Unix socket)."""
    if not isinstance(peer, tuple) or not peer:
        return ""
    try:
        address = ipaddress.ip_address(str(peer[0]).partition("%")[0])
    except ValueError:
        return str(peer[0])
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


@dataclass
class _Census:
    """One server's connections: those served, by client, and refusals waiting for their request line."""

    served: int = 0
    by_client: Counter[str] = field(default_factory=Counter)
    refusing: int = 0
    refused: int = 0
    _logged_at: float = -1e9
    _since: int = 0

    def note_refused(self, cap: str, client: str, every_s: float = 10.0) -> None:
        """Counts a refusal; logs one line per ``every_s`` at most."""
        self.refused += 1
        self._since += 1
        now = time.monotonic()
        if now - self._logged_at >= every_s:
            log.warning(
                f"connections refused: {cap} reached",
                extra={"open": self.served, "refused": self._since, "client": client},
            )
            self._logged_at, self._since = now, 0


class _BoundedProtocol(HttpToolsProtocol):
    limits: ConnectionLimits
    census: _Census

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._reading_headers = True
        self._header_bytes = 0
        self._header_count = 0
        self._header_timer: asyncio.TimerHandle | None = None
        self._served_as: str | None = None  # the client key, while this connection is counted served
        self._refusal: tuple[str, bytearray, asyncio.TimerHandle] | None = None  # cap, bytes read, timer

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        census, client = self.census, client_of(self.client)
        if census.served >= self.limits.max_connections:
            self._refuse_connection("api.max_connections", client)
        elif census.by_client[client] >= self.limits.max_connections_per_client:
            self._refuse_connection("api.max_connections_per_client", client)
        else:
            census.served += 1
            census.by_client[client] += 1
            self._served_as = client
            self._arm_header_timer()

    def _refuse_connection(self, cap: str, client: str) -> None:
        census = self.census
        census.note_refused(cap, client)
        if census.refusing >= MAX_REFUSING:
            self.transport.close()
            return
        census.refusing += 1
        wait_s = min(REFUSAL_WAIT_S, self.limits.header_timeout_s)
        self._refusal = (cap, bytearray(), self.loop.call_later(wait_s, self.transport.close))

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        if self._served_as is not None:
            self.census.served -= 1
            self.census.by_client[self._served_as] -= 1
            if not self.census.by_client[self._served_as]:
                del self.census.by_client[self._served_as]
            self._served_as = None
        if self._refusal is not None:
            self.census.refusing -= 1
            self._refusal[2].cancel()
            self._refusal = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refusal is not None:
            self._read_refused(data)
            return
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

    def _read_refused(self, data: bytes) -> None:
        """A refused connection's bytes: its request line answered 503, never parsed further."""
        assert self._refusal is not None
        cap, seen, _ = self._refusal
        seen += data[: MAX_REQUEST_LINE - len(seen)]
        line, newline, _ = bytes(seen).partition(b"\n")
        if newline and not self.transport.is_closing():
            self.transport.write(_503(line.rstrip(b"\r"), cap))
            self.transport.close()
        elif len(seen) >= MAX_REQUEST_LINE:
            self.transport.close()

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
    """uvicorn's httptools protocol class with ``limits`` (pass it as ``uvicorn.Config(http=...)``);
    its connections are counted together (one class per server)."""
    return type("BoundedHttpProtocol", (_BoundedProtocol,), {"limits": limits, "census": _Census()})
