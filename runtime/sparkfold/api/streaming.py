"""Server-sent events from the engine: reading its stream.

:func:`upstream_events` turns the engine's SSE bytes into batches of payloads (one batch per
network read), inserting ``None`` after every ``keepalive_s`` of silence (routes turn it into
``: keepalive`` or an Anthropic ``ping``). Encoding events is :mod:`sparkfold.sse`; sending
them is :class:`sparkfold.asgi.SSEResponse`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

from sparkfold.sse import split_events

__all__ = ["Read", "upstream_events"]


Read = Callable[[float], Awaitable[bytes | None]]


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
