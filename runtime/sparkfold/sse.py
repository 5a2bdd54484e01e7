"""Server-sent events: the one place both our servers (gateway and engine server) encode and split them.

Encoding: :func:`sse_event` (a ``data:`` event), :func:`named_event` (``event:`` + ``data:``, the
Anthropic and Responses dialects), :func:`data_event` (a payload that already is JSON text),
:data:`SSE_DONE`, :data:`KEEPALIVE_COMMENT`, and :class:`TextEvents` (the per-token fast path).
Decoding: :func:`split_events` (the ``data`` payloads of the complete events in a buffer).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel

__all__ = [
    "KEEPALIVE_COMMENT",
    "SSE_DONE",
    "TextEvents",
    "data_event",
    "named_event",
    "split_events",
    "sse_event",
]

SSE_DONE = b"data: [DONE]\n\n"
KEEPALIVE_COMMENT = b": keepalive\n\n"


def _json(payload: dict[str, Any]) -> str:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False)


def sse_event(payload: BaseModel | dict[str, Any]) -> bytes:
    """One ``data:`` event."""
    body = payload.model_dump_json(exclude_none=True) if isinstance(payload, BaseModel) else _json(payload)
    return f"data: {body}\n\n".encode()


def data_event(payload: bytes) -> bytes:
    """One ``data:`` event around ``payload``, JSON text as received (never re-encoded)."""
    return b"data: " + payload + b"\n\n"


def named_event(name: str, payload: dict[str, Any]) -> bytes:
    """One ``event: name`` event with ``payload`` as its data."""
    return f"event: {name}\ndata: {_json(payload)}\n\n".encode()


class TextEvents:
    """One stream's events that differ only in one string field (a token's text), made fast.

    ``TextEvents(model, marker)`` dumps ``model`` once (its string field set to ``marker``) and
    splits the event around it; each event is then that head, the text as a JSON string, and
    the tail: one ``json.dumps`` instead of building and dumping a model per token.
    """

    MARKER = "\x00sparkfold-text\x00"

    def __init__(self, model: BaseModel, marker: str = MARKER) -> None:
        parts = sse_event(model).split(json.dumps(marker).encode())
        if len(parts) != 2:
            raise ValueError("the marker must occur exactly once in the model's JSON")
        self._head, self._tail = parts

    def __call__(self, text: str) -> bytes:
        return self._head + json.dumps(text, ensure_ascii=False).encode() + self._tail


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
