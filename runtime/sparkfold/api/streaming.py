"""Server-sent events: reading the engine's stream, and sending ours with disconnect detection.

:func:`upstream_events` turns the engine's SSE bytes into batches of payloads (one batch per
network read), inserting ``None`` after every ``keepalive_s`` of silence (routes turn it into
``: keepalive`` or an Anthropic ``ping``). :class:`SSEResponse` sends an :class:`EventStream`
and watches the client's connection at the same time: when the client leaves, the stream is
cancelled and closed at once (which closes the engine connection, so the engine stops
generating), and the lane is freed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from starlette.types import Receive, Scope, Send

__all__ = ["KEEPALIVE_COMMENT", "EventStream", "Read", "SSEResponse", "split_events", "upstream_events"]

log = logging.getLogger(__name__)

Read = Callable[[float], Awaitable[bytes | None]]

KEEPALIVE_COMMENT = b": keepalive\n\n"
CANCEL_GRACE_S = 1.0

SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
]


def split_events(buffer: bytes) -> tuple[list[bytes], bytes]:
    """The ``data`` payloads of the complete SSE events in ``buffer``, and the incomplete rest."""
    if b"\r" in buffer:
        buffer = buffer.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    *blocks, rest = buffer.split(b"\n\n")
    payloads = []
    for block in blocks:
        if block.startswith(b"data:") and b"\n" not in block:  # the usual one-line event
            payloads.append(block[5:].strip())
            continue
        data = [line[5:].strip() for line in block.split(b"\n") if line.startswith(b"data:")]
        if data:  # comments (": keepalive") and other fields carry no payload
            payloads.append(b"\n".join(data))
    return payloads, rest


async def upstream_events(read: Read, keepalive_s: float) -> AsyncIterator[list[bytes] | None]:
    """Batches of ``data:`` payloads (all complete events of one network read), and ``None``
    after each ``keepalive_s`` without any. Upstream errors are raised to the caller in order.

    ``read(wait_s)`` returns the next bytes, ``b""`` at the end, or ``None`` after ``wait_s`` of
    silence (see :meth:`sparkfold.api.upstream.EngineStream.read`). Batching keeps the cost per
    event low under load: one parse and one send per read, and no task or queue in between.
    """
    rest = b""
    while True:
        chunk = await read(keepalive_s)
        if chunk is None:
            yield None
            continue
        if not chunk:
            break
        payloads, rest = split_events(rest + chunk if rest else chunk)
        if payloads:
            yield payloads
    if rest.strip():
        payloads, _ = split_events(rest + b"\n\n")
        if payloads:
            yield payloads


@dataclass
class EventStream:
    """The bytes of a streamed response and how to release what feeds them."""

    events: AsyncIterator[bytes]
    close: Callable[[], Awaitable[None]]
    on_client_gone: Callable[[], None] | None = None


class SSEResponse:
    """An ASGI response that sends an :class:`EventStream` and cancels it if the client leaves."""

    def __init__(self, stream: EventStream) -> None:
        self.stream = stream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gone = False
        sender: asyncio.Task[None] | None = None
        watcher: asyncio.Task[None] | None = None
        try:
            await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
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
