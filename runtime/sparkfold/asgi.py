"""ASGI plumbing both of our HTTP servers (the gateway and the engine server) share.

:class:`SSEResponse` sends an :class:`EventStream` and watches the client's connection at the
same time: when the client leaves, the stream is cancelled and closed at once (the gateway then
closes its engine connection; the engine server stops generating), and whatever fed it is
released. :class:`StreamResponse` is the same as a starlette ``Response``, so FastAPI passes it
through. :class:`DirectRoutes` runs the few routes that carry the load without FastAPI's
per-request layers (its middleware stack, route matching over every route, the exception wrapper
around each streamed ``send``), which cost more CPU per streamed token than the rest together.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["SSE_HEADERS", "DirectRoutes", "EventStream", "Handler", "SSEResponse", "StreamResponse"]

log = logging.getLogger(__name__)

CANCEL_GRACE_S = 1.0

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

    def __init__(self, stream: EventStream, headers: Sequence[tuple[bytes, bytes]] = SSE_HEADERS) -> None:
        self.stream = stream
        self.headers = list(headers)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gone = False
        sender: asyncio.Task[None] | None = None
        watcher: asyncio.Task[None] | None = None
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.headers})
            sender = asyncio.create_task(self._send_all(send))
            watcher = asyncio.create_task(_wait_disconnect(receive))
            watcher.add_done_callback(lambda _: sender.cancel())  # the client left: stop sending
            try:
                await sender
            except asyncio.CancelledError:
                if watcher.cancelled() or not watcher.done():
                    raise  # this response itself is being cancelled (the server stops)
                gone = True  # the watcher saw the client leave
            except OSError:
                gone = True  # a failed send: the client is gone
            except Exception:
                log.exception("stream failed")
        except OSError:
            gone = True
        finally:
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

    async def _send_all(self, send: Send) -> None:
        async for chunk in self.stream.events:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


class StreamResponse(Response):
    """A starlette ``Response`` around :class:`SSEResponse` (so frameworks pass it through)."""

    media_type = "text/event-stream"

    def __init__(self, stream: EventStream, headers: Sequence[tuple[bytes, bytes]] = SSE_HEADERS) -> None:
        super().__init__(status_code=200)
        self._sse = SSEResponse(stream, headers)

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
        response = await handler(Request(scope, receive))
        await response(scope, receive, send)
