"""Server-sent events from the engine: reading its stream.

:func:`upstream_events` turns the engine's SSE bytes into batches of payloads (one batch per
network read), inserting ``None`` after every ``keepalive_s`` of silence (routes turn it into
``: keepalive`` or an Anthropic ``ping``). Sending ours is :class:`sparkfold.asgi.SSEResponse`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

__all__ = ["KEEPALIVE_COMMENT", "Read", "split_events", "upstream_events"]


Read = Callable[[float], Awaitable[bytes | None]]

KEEPALIVE_COMMENT = b": keepalive\n\n"


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
