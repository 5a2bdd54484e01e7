"""ASGI plumbing both of our HTTP servers (the gateway and the engine server) share.

Disconnect watching lives here, once (:func:`wait_disconnect`), and so does cancellation: a gone
client ends the work, streamed or not.

:class:`SSEResponse` sends an :class:`EventStream` and watches the client's connection at the
same time: when the client leaves, the stream is cancelled and closed at once (the gateway then
closes its engine connection; the engine server stops generating), and whatever fed it is
released. Its :class:`Pacing` sends a ``: keepalive`` comment to a client that has received
nothing for ``keepalive_s``, whatever feeds the stream, and treats a client that has not taken a
write for ``send_timeout_s`` (it stopped reading; its socket buffers are full) as gone.
:class:`StreamResponse` is the same as a starlette ``Response``, so FastAPI passes it through.

:class:`DirectRoutes` runs the few routes that carry the load without FastAPI's per-request
layers (its middleware stack, route matching over every route, the exception wrapper around each
streamed ``send``), which cost more CPU per streamed token than the rest together. It reads the
body first, then runs the handler while watching the connection: a client that leaves before the
answer is ready (a non-streamed request) cancels the handler, so nothing generates for nobody.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sparkfold.sse import KEEPALIVE_COMMENT

__all__ = [
    "PACING_KEY",
    "SSE_HEADERS",
    "BodyTooLarge",
    "ClientGone",
    "DirectRoutes",
    "EventStream",
    "Handler",
    "Pacing",
    "SSEResponse",
    "StreamResponse",
    "methods_on",
    "read_body",
    "replay",
    "unless_disconnected",
    "wait_disconnect",
]

log = logging.getLogger(__name__)

_CUT = contextvars.ContextVar("stream_cut", default=False)
"""Set in a request's task when its stream was cut because the client stopped reading."""
UVICORN_INCOMPLETE = "ASGI callable returned without completing response."


class _HandledCuts(logging.Filter):
    """uvicorn logs an ERROR for a response its app left incomplete; a stream cut because the
    client stopped reading (:class:`SSEResponse`) is one, and handled: logged at INFO instead.
    The record is made in the request's task, after the app returned, so :data:`_CUT` is its own."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _CUT.get() and record.msg == UVICORN_INCOMPLETE:
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg = "the stream of a client that stopped reading was cut (handled)"
        return True


def _note_cut() -> None:
    _CUT.set(True)
    uvicorn_errors = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _HandledCuts) for f in uvicorn_errors.filters):
        uvicorn_errors.addFilter(_HandledCuts())


CANCEL_GRACE_S = 1.0
PACING_KEY = "stream_pacing"
"""Where a server puts its :class:`Pacing` in the ASGI scope's ``state`` (read by :class:`SSEResponse`)."""

T = TypeVar("T")


@dataclass(frozen=True)
class Pacing:
    """How a stream treats its client: keepalives after ``keepalive_s`` of nothing sent, and
    the client counted gone once one write has waited ``send_timeout_s`` for it to read.
    ``alive`` (when given) must be true for a keepalive to go out: an engine server heartbeats
    only while its engine makes progress."""

    keepalive_s: float = 15.0
    send_timeout_s: float = 60.0
    alive: Callable[[], bool] | None = None


DEFAULT_PACING = Pacing()

SSE_HEADERS = (
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
)

Handler = Callable[[Request], Awaitable[Response]]


async def _nothing_to_release() -> None:
    return None


@dataclass
class EventStream:
    """The bytes of a streamed response and how to release what feeds them (besides closing ``events``)."""

    events: AsyncIterator[bytes]
    close: Callable[[], Awaitable[None]] = _nothing_to_release
    on_client_gone: Callable[[], None] | None = None


class SSEResponse:
    """An ASGI response that sends an :class:`EventStream` and cancels it if the client leaves."""

    def __init__(
        self,
        stream: EventStream,
        headers: Sequence[tuple[bytes, bytes]] = SSE_HEADERS,
        pacing: Pacing | None = None,
    ) -> None:
        self.stream = stream
        self.headers = list(headers)
        self.pacing = pacing

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        pacing: Pacing = self.pacing or scope.get("state", {}).get(PACING_KEY) or DEFAULT_PACING
        gone = False
        sender: asyncio.Task[None] | None = None
        watcher: asyncio.Task[None] | None = None
        paced: _Paced | None = None
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.headers})
            paced = _Paced(send, pacing)
            sender = asyncio.create_task(self._send_all(paced))
            paced.start(sender)
            watcher = asyncio.create_task(wait_disconnect(receive))
            watcher.add_done_callback(lambda _: sender.cancel())  # the client left: stop sending
            try:
                await sender
            except asyncio.CancelledError:
                if paced.stalled:
                    gone = True  # the client stopped reading: as good as gone
                    log.info("a client stopped reading for %.0f s; its stream ends", pacing.send_timeout_s)
                    _note_cut()
                elif watcher.cancelled() or not watcher.done():
                    raise  # this response itself is being cancelled (the server stops)
                else:
                    gone = True  # the watcher saw the client leave
            except OSError:
                gone = True  # a failed send: the client is gone
            except Exception:
                log.exception("stream failed")
        except OSError:
            gone = True
        finally:
            if paced is not None:
                paced.stop()
            if watcher is not None:
                watcher.cancel()  # nothing to wait for: it only reads the client's messages
            if sender is not None and not sender.done():
                sender.cancel()  # a bounded moment to unwind; the upstream is closed below anyway
                await asyncio.wait([sender], timeout=CANCEL_GRACE_S)
            if sender is not None and sender.done() and not sender.cancelled():
                sender.exception()  # retrieved: never "exception was never retrieved"
            with contextlib.suppress(Exception):
                await self.stream.events.aclose()  # type: ignore[attr-defined]
            await self.stream.close()
        if gone and self.stream.on_client_gone is not None:
            self.stream.on_client_gone()

    async def _send_all(self, paced: _Paced) -> None:
        async for chunk in self.stream.events:
            await paced.send(chunk)
        await paced.send(b"", more_body=False)


class _Paced:
    """``send`` with a keepalive after ``keepalive_s`` of nothing sent and a limit on one write.

    One timer per stream (not per write) checks both: it is set for the moment the next
    keepalive is due or the current write runs out of time, whichever comes first.
    """

    def __init__(self, send: Send, pacing: Pacing) -> None:
        self._send = send
        self._pacing = pacing
        self._loop = asyncio.get_running_loop()
        self._last = self._loop.time()
        self._writing_since: float | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._sender: asyncio.Task[None] | None = None
        self._keepalive: asyncio.Task[None] | None = None
        self.stalled = False

    def start(self, sender: asyncio.Task[None]) -> None:
        self._sender = sender
        self._arm()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._keepalive is not None and not self._keepalive.done():
            self._keepalive.cancel()

    async def send(self, body: bytes, *, more_body: bool = True) -> None:
        self._writing_since = self._loop.time()
        try:
            await self._send({"type": "http.response.body", "body": body, "more_body": more_body})
        finally:
            self._writing_since = None
            self._last = self._loop.time()

    def _arm(self) -> None:
        due = self._last + self._pacing.keepalive_s
        if self._writing_since is not None:
            due = min(due, self._writing_since + self._pacing.send_timeout_s)
        self._timer = self._loop.call_at(due, self._tick)

    def _tick(self) -> None:
        now = self._loop.time()
        since = self._writing_since
        if since is not None and now - since >= self._pacing.send_timeout_s:
            self.stalled = True
            if self._sender is not None:
                self._sender.cancel()
            return
        idle = since is None and now - self._last >= self._pacing.keepalive_s
        busy = self._keepalive is not None and not self._keepalive.done()
        if idle and not busy and (self._pacing.alive is None or self._pacing.alive()):
            self._keepalive = self._loop.create_task(self.send(KEEPALIVE_COMMENT))
        elif idle:
            self._last = now  # not alive (or a keepalive still going out): wait a whole interval
        self._arm()


def methods_on(routes: Sequence[BaseRoute], scope: Scope) -> list[str]:
    """The methods some route answers on ``scope``'s path (HEAD left out, as GET implies it): a
    405's ``Allow`` (starlette's names the first route on the path only)."""
    methods: set[str] = set()
    for route in routes:
        if route.matches(scope)[0] != Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    return sorted(methods - {"HEAD"})


async def wait_disconnect(receive: Receive) -> None:
    """Return once the client's connection is gone (reads and drops any other message)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(work: Awaitable[T], receive: Receive) -> T | None:
    """``work``'s result, or ``None`` once the client left first (``work`` is then cancelled).

    The one cancellation wrapper: every generating route runs under it (through
    :class:`DirectRoutes`), so a non-streamed request whose client left stops generating.
    """
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(wait_disconnect(receive))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not watcher.done():
            watcher.cancel()
    if task.done():
        return task.result()
    task.cancel()
    await asyncio.wait([task], timeout=CANCEL_GRACE_S)
    if task.done() and not task.cancelled():
        task.exception()  # retrieved: never "exception was never retrieved"
    return None


class StreamResponse(Response):
    """A starlette ``Response`` around :class:`SSEResponse` (so frameworks pass it through); a bare
    :class:`EventStream` gets the default headers and no pacing."""

    media_type = "text/event-stream"

    def __init__(self, sse: SSEResponse | EventStream) -> None:
        super().__init__(status_code=200)
        self._sse = sse if isinstance(sse, SSEResponse) else SSEResponse(sse)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._sse(scope, receive, send)


class DirectRoutes:
    """ASGI: a POST to one of ``handlers``' paths calls its handler directly; the rest go to ``app``.

    ``app`` keeps declaring every route (``/openapi.json`` and ``/docs`` are made from it) and
    serves all the others.
    """

    def __init__(self, app: ASGIApp, handlers: Mapping[str, Handler]) -> None:
        self.app = app
        self.handlers = dict(handlers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        handler = self.handlers.get(scope["path"]) if scope["type"] == "http" else None
        if handler is None or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        scope["app"] = self.app  # what Request.app reads
        state = scope.setdefault("state", {})
        if state.get("body") is None:  # (the gateway's BodyLimit read it already)
            try:
                state["body"] = await read_body(receive)
            except ClientGone:
                return  # the client left before it finished sending
        request = Request(scope, replay(state["body"], receive))
        response = await unless_disconnected(handler(request), receive)
        if response is not None:
            await response(scope, receive, send)


class ClientGone(Exception):
    """The client disconnected before the request was read (or answered)."""


class BodyTooLarge(Exception):
    """The request body passed the limit :func:`read_body` was given."""


async def read_body(receive: Receive, limit: int | None = None) -> bytes:
    """The whole body; :class:`BodyTooLarge` past ``limit`` bytes, :class:`ClientGone` if the client left."""
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        chunk = message.get("body", b"")
        size += len(chunk)
        if limit is not None and size > limit:
            raise BodyTooLarge
        parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)


def replay(body: bytes, receive: Receive) -> Receive:
    """A receive that yields ``body`` once, then defers to the real one (which reports disconnects)."""
    sent = False

    async def _receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return _receive
