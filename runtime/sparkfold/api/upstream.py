"""The one engine server, reached over HTTP/1.1 keep-alive connections (``settings.engine_url``).

:class:`Engine` keeps a pool of idle connections to the engine; each is an asyncio protocol that
parses responses with ``httptools`` (the C parser uvicorn uses for requests). The gateway only
ever sends small JSON requests to one plain-HTTP server on a trusted link, so a general client
(redirects, cookies, TLS, proxies, HTTP/2, connection-pool bookkeeping per request) is cost
without use: here a request is one write and a response a few parser callbacks.

:meth:`Engine.post_reply` types a generating route's answer with the ``protocol.py`` models (an
answer that does not follow them is a 502 naming the field); the other JSON calls return the decoded
body. Either raises an :mod:`~sparkfold.api.errors` error: the engine's own 4xx keeps its status and
message (it is the client's mistake), anything else becomes an
:class:`~sparkfold.api.errors.UpstreamError`. :meth:`Engine.open_stream` opens a streamed request
and checks its status *before* the gateway starts its own response, so a refusal is still a plain
JSON error; the caller must :meth:`EngineStream.aclose` it. Closing a stream that has not ended
closes its connection: that is how the engine learns the client left and frees its lane. A finished
response's connection goes back to the pool.

Two deadlines: until the first token the engine may be silent for ``first_token_timeout_s`` (a
long prompt is being read: a 1,048,576-token prefill at ~700 tok/s takes ~1500 s); once the
reader says the first token came (:meth:`EngineStream.first_token`), for ``timeout_s``. Any byte
counts as life, the engine server's ``: keepalive`` heartbeats included. A non-streamed
generation gets both (:attr:`Engine.reply_timeout_s`).

``connect`` is the seam tests (or another transport) use: it is called like
``loop.create_connection`` without the address, and by default dials the engine's host and port.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httptools
from pydantic import BaseModel

from sparkfold.api.errors import (
    ApiError,
    ClientError,
    EngineAtCapacity,
    InvalidRequest,
    Overloaded,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from sparkfold.protocol import ProtocolError, read_reply

__all__ = ["CONNECT_TIMEOUT_S", "Connect", "Engine", "EngineStream"]

CONNECT_TIMEOUT_S = 5.0
DEFAULT_IDLE_CONNECTIONS = 8
W = TypeVar("W", bound=BaseModel)
_HIGH_WATER = 1 << 18  # bytes buffered from the engine before reading from it pauses

Connect = Callable[
    [Callable[[], asyncio.Protocol]], Awaitable[tuple[asyncio.BaseTransport, asyncio.Protocol]]
]


class _Stale(Exception):
    """A reused keep-alive connection closed before any byte of the answer: safe to send again."""


class _Connection(asyncio.Protocol):
    """One connection to the engine, carrying one exchange at a time.

    The parser callbacks fill in the current response; :meth:`wait` blocks the reader until
    something changes (headers, body bytes, the end, or the connection's loss).
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.reused = False
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False
        self.begin()

    def begin(self) -> None:
        """Forget the previous exchange (the connection is about to carry a new one)."""
        self.status = 0
        self.headers_done = False
        self.complete = False
        self.error: ApiError | _Stale | None = None
        self.body: list[bytes] = []
        self.buffered = 0
        self.received = False
        self._framed = False  # content-length or chunked: the end does not depend on EOF

    # --- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        self.received = True
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.error = UpstreamError(f"the engine sent malformed HTTP: {exc}")
            self.close()
            self._wake()

    def eof_received(self) -> bool | None:
        self.closed = True  # never picked from the pool again, even before connection_lost
        return False  # close the transport; connection_lost tells the reader

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.headers_done and not self._framed and not self.complete:
            self.complete = True  # a body that ends with the connection (no length, not chunked)
        elif not self.complete and self.error is None:
            if self.reused and not self.received:
                self.error = _Stale()
            else:
                reason = type(exc).__name__ if exc is not None else "connection closed"
                self.error = UpstreamError(f"the engine's stream broke off: {reason}")
        self._wake()

    # --- httptools callbacks -----------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() in (b"content-length", b"transfer-encoding"):
            self._framed = True

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        self.headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)
        self.buffered += len(body)
        if self.buffered > _HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        if not self.parser.should_keep_alive():
            self.close()
        self._wake()

    # --- for Engine and EngineStream ---------------------------------------------------------
    def send(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    def take(self) -> bytes:
        """Everything received of the body so far (and reading resumes if it was paused)."""
        data = self.body[0] if len(self.body) == 1 else b"".join(self.body)
        self.body = []
        self.buffered = 0
        if self._paused and self.transport is not None and not self.closed:
            self._paused = False
            self.transport.resume_reading()
        return data

    async def wait(self, deadline: float) -> bool:
        """Wait for news from the engine until ``deadline`` (loop time); False when it passed."""
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = loop.call_at(deadline, _expire, waiter)
        try:
            await waiter
            return True
        except TimeoutError:
            return False
        finally:
            timer.cancel()
            self._waiter = None

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError())


class EngineStream:
    """An open streamed response from the engine."""

    def __init__(
        self, engine: Engine, connection: _Connection, timeout_s: float, first_token_timeout_s: float
    ) -> None:
        self._engine = engine
        self._connection: _Connection | None = connection
        self._timeout_s = first_token_timeout_s
        self._after_first_s = timeout_s
        self._silent_since = asyncio.get_running_loop().time()

    def first_token(self) -> None:
        """The first token came: from now on the engine may be silent for ``timeout_s`` only."""
        self._timeout_s = self._after_first_s

    async def read(self, wait_s: float) -> bytes | None:
        """The next bytes of the body (``b""`` once it ended), or ``None`` after ``wait_s`` of
        silence. Raises UpstreamTimeout once the engine has been silent past the engine timeout,
        UpstreamError when the connection breaks. Cancelling a read loses nothing."""
        connection = self._connection
        if connection is None:
            return b""
        loop = asyncio.get_running_loop()
        while True:
            if connection.body:
                self._silent_since = loop.time()
                return connection.take()
            if connection.error is not None:
                raise _as_api_error(connection.error)
            if connection.complete:
                return b""
            give_up = self._silent_since + self._timeout_s
            wake = min(loop.time() + wait_s, give_up)
            if not await connection.wait(wake):
                if wake >= give_up:
                    raise UpstreamTimeout("the engine stopped sending mid-stream")
                return None

    async def finish(self, wait_s: float) -> None:
        """Read the rest of the body (dropped) for at most ``wait_s``: a response read to its end
        lets :meth:`aclose` give the connection back instead of closing it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while (left := deadline - loop.time()) > 0 and await self.read(left) not in (b"", None):
            pass

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives (no line splitting here: that is the SSE reader's job)."""
        while True:
            chunk = await self.read(self._timeout_s)
            if chunk == b"":
                return
            if chunk is not None:
                yield chunk

    async def aclose(self) -> None:
        """Give the connection back when the body was read to its end; close it otherwise."""
        self._engine._streams.discard(self)
        connection, self._connection = self._connection, None
        if connection is not None:
            self._engine._release(connection)

    def interrupt(self, error: ApiError) -> None:
        """End the stream now: what was received is still read, then ``error`` is raised."""
        connection = self._connection
        if connection is not None and connection.error is None and not connection.complete:
            connection.error = error
            connection.close()
            connection._wake()


class Engine:
    """Client of the engine server at ``base_url``; ``connect`` swaps the network out in tests."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float,
        first_token_timeout_s: float | None = None,
        connect: Connect | None = None,
        concurrency: int = DEFAULT_IDLE_CONNECTIONS,
    ) -> None:
        url = urlsplit(base_url)
        if url.scheme != "http" or not url.hostname:
            raise ValueError(f"the engine URL must be http://host:port, not {base_url!r}")
        self.base_url = base_url
        self._host, self._port = url.hostname, url.port or 80
        self._prefix = url.path.rstrip("/")
        self._host_header = url.netloc.encode("latin-1")
        self._timeout_s = timeout_s
        self._first_token_timeout_s = timeout_s if first_token_timeout_s is None else first_token_timeout_s
        self._connect = connect
        self._max_idle = max(1, concurrency)
        self._idle: list[_Connection] = []
        self._streams: set[EngineStream] = set()

    def __repr__(self) -> str:
        return f"Engine({self.base_url!r})"

    async def aclose(self) -> None:
        while self._idle:
            self._idle.pop().close()

    async def get_json(self, path: str, *, timeout_s: float | None = None) -> dict[str, Any]:
        status, body = await self._call(b"GET", path, None, timeout_s)
        return _decode(status, body)

    async def get_reply(self, path: str, model: type[W], *, timeout_s: float | None = None) -> W:
        """``GET path`` typed as ``model``, as :meth:`post_reply` types a POST's answer."""
        status, content = await self._call(b"GET", path, None, timeout_s)
        return _typed(path, status, content, model)

    async def get_text(self, path: str, *, timeout_s: float | None = None) -> str:
        status, body = await self._call(b"GET", path, None, timeout_s)
        if status != 200:
            raise UpstreamError(f"the engine answered {path} with HTTP {status}")
        return body.decode("utf-8", "replace")

    @property
    def reply_timeout_s(self) -> float:
        """The longest a non-streamed generation may stay silent: first token, then the rest."""
        return self._first_token_timeout_s + self._timeout_s

    async def post_json(
        self, path: str, body: dict[str, Any], *, timeout_s: float | None = None
    ) -> dict[str, Any]:
        status, content = await self._call(b"POST", path, _json(body), timeout_s)
        return _decode(status, content)

    async def post_reply(
        self, path: str, body: dict[str, Any], model: type[W], *, timeout_s: float | None = None
    ) -> W:
        """``POST path`` and its answer typed as ``model`` (a ``protocol.py`` model); an answer
        that does not follow the engine protocol is an UpstreamError (502) naming the field."""
        status, content = await self._call(b"POST", path, _json(body), timeout_s)
        return _typed(path, status, content, model)

    async def open_stream(self, path: str, body: dict[str, Any]) -> EngineStream:
        content = _json(body)
        connection = await self._exchange(b"POST", path, content, self._first_token_timeout_s, stream=True)
        if connection.status != 200:
            try:
                content = await self._read_all(connection, self._timeout_s)
            finally:
                self._release(connection)
            raise _status_error(connection.status, content)
        stream = EngineStream(self, connection, self._timeout_s, self._first_token_timeout_s)
        self._streams.add(stream)
        return stream

    def interrupt_streams(self, error: ApiError) -> int:
        """End every open stream with ``error`` (each client then gets its dialect's error event
        and end of stream); the count of streams interrupted."""
        streams = list(self._streams)
        for stream in streams:
            stream.interrupt(error)
        return len(streams)

    # --- the exchange -----------------------------------------------------------------------
    async def _call(
        self, method: bytes, path: str, content: bytes | None, timeout_s: float | None
    ) -> tuple[int, bytes]:
        timeout = self._timeout_s if timeout_s is None else timeout_s
        connection = await self._exchange(method, path, content, timeout)
        try:
            body = await self._read_all(connection, timeout)
        finally:
            self._release(connection)
        return connection.status, body

    async def _exchange(
        self, method: bytes, path: str, content: bytes | None, timeout_s: float, *, stream: bool = False
    ) -> _Connection:
        """Send the request and wait for the answer's headers; the connection carries the body."""
        head = b"%s %s HTTP/1.1\r\nhost: %s\r\n" % (method, (self._prefix + path).encode(), self._host_header)
        if stream:
            head += b"accept: text/event-stream\r\n"
        if content is not None:
            head += b"content-type: application/json\r\ncontent-length: %d\r\n" % len(content)
        request = head + b"\r\n" + (content or b"")
        loop = asyncio.get_running_loop()
        for attempt in (1, 2):
            # a pooled connection the engine closed at that very moment is retried on a new one
            connection = await self._acquire(pooled=attempt == 1)
            try:
                connection.send(request)
                deadline = loop.time() + timeout_s
                while not connection.headers_done:
                    if connection.error is not None:
                        raise connection.error
                    if not await connection.wait(deadline):
                        raise UpstreamTimeout(f"the engine did not answer {path} in time")
                return connection
            except _Stale:
                if attempt == 2:
                    message = f"the engine at {self.base_url} closed the connection"
                    raise UpstreamUnavailable(message) from None
            except BaseException:
                connection.close()
                raise
        raise AssertionError("unreachable")

    async def _read_all(self, connection: _Connection, timeout_s: float) -> bytes:
        loop = asyncio.get_running_loop()
        parts: list[bytes] = []
        while True:
            if connection.body:
                parts.append(connection.take())
            if connection.error is not None:
                raise _as_api_error(connection.error)
            if connection.complete:
                return b"".join(parts)
            if not await connection.wait(loop.time() + timeout_s):
                raise UpstreamTimeout("the engine stopped sending its answer")

    async def _acquire(self, *, pooled: bool = True) -> _Connection:
        while pooled and self._idle:
            connection = self._idle.pop()
            if not connection.closed:
                connection.reused = True
                connection.begin()
                return connection
        connect = self._connect or self._dial
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                _, protocol = await connect(_Connection)
        except TimeoutError:
            message = f"the engine at {self.base_url} did not accept a connection in time"
            raise UpstreamTimeout(message) from None
        except OSError as exc:
            raise UpstreamUnavailable(f"cannot reach the engine at {self.base_url}: {exc}") from None
        assert isinstance(protocol, _Connection)
        return protocol

    def _dial(
        self, factory: Callable[[], asyncio.Protocol]
    ) -> Awaitable[tuple[asyncio.BaseTransport, asyncio.Protocol]]:
        return asyncio.get_running_loop().create_connection(factory, self._host, self._port)

    def _release(self, connection: _Connection) -> None:
        """Pool a connection whose answer was read to its end; close any other."""
        reusable = connection.complete and not connection.closed and connection.error is None
        if reusable and len(self._idle) < self._max_idle:
            self._idle.append(connection)
        else:
            connection.close()


def _as_api_error(error: ApiError | _Stale) -> ApiError:
    if isinstance(error, ApiError):
        return error
    return UpstreamError("the engine closed the connection before answering")


def _json(body: dict[str, Any]) -> bytes:
    """Strict JSON: NaN and Infinity (which Python's parser lets in) are the client's mistake."""
    try:
        text = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError:
        raise InvalidRequest("the request holds NaN or Infinity, which JSON does not allow") from None
    try:
        return text.encode()
    except UnicodeEncodeError:
        raise InvalidRequest(
            "the request holds a lone UTF-16 surrogate (\\ud800 to \\udfff), which is not text"
        ) from None


def _decode(status: int, content: bytes) -> dict[str, Any]:
    if status != 200:
        raise _status_error(status, content)
    try:
        body = json.loads(content)
    except ValueError as exc:
        raise UpstreamError("the engine answered with a body that is not JSON") from exc
    if not isinstance(body, dict):
        raise UpstreamError("the engine answered with JSON that is not an object")
    return body


def _typed(path: str, status: int, content: bytes, model: type[W]) -> W:
    """An answer typed as ``model``; one that does not follow the engine protocol is an
    UpstreamError (502) naming the field."""
    if status != 200:
        raise _status_error(status, content)
    try:
        return read_reply(model, content)
    except ProtocolError as exc:
        raise UpstreamError(
            f"the engine's answer to {path} does not follow the engine protocol: {exc}"
        ) from None


def _status_error(status: int, content: bytes) -> ApiError:
    """The engine's refusal as our error: its 4xx stay the client's, the rest are upstream failures."""
    message, param, code = f"the engine answered HTTP {status}", None, None
    try:
        info = json.loads(content).get("error")
        if isinstance(info, dict):
            message = str(info.get("message") or message)
            param = info.get("param") if isinstance(info.get("param"), str) else None
            code = str(info["code"]) if info.get("code") is not None else None
    except (ValueError, AttributeError):
        pass
    if 400 <= status < 500 and status not in (408, 429):
        error: ApiError = ClientError(message, param=param, code=code)
        error.status = status
        return error
    if status == 429:
        return Overloaded(message)
    if status == 503 and code == "capacity":
        return EngineAtCapacity(message, code=code)
    if status == 503:
        return UpstreamUnavailable(message)
    return UpstreamError(message)
