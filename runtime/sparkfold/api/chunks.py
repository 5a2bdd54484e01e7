"""The engine's stream chunks, typed at the seam: each SSE payload read through ``protocol.py``.

:class:`ChunkReader` turns the payloads of one engine stream into chat events (the event kinds
are :mod:`sparkfold.api.chat_stream`'s): a payload is validated as the stream's chunk model
(:class:`~sparkfold.protocol.ChatCompletionChunk`, or :class:`~sparkfold.protocol.Completion`
for ``/v1/completions``) or as an :class:`~sparkfold.protocol.ErrorResponse`; one that is neither
becomes one error event that names the field (``choices.0.delta.tool_calls.0.index: Field
required``), never an exception. What a chunk says is read from the model; what goes on to the
client is the engine's own JSON (its bytes when nothing was rewritten), so a field the models do
not name still reaches the client.

The rewrites: the reasoning alias (``reasoning`` beside ``reasoning_content``, as vLLM's clients
read it), tool-call hygiene (:mod:`sparkfold.api.tools`; calls announced when their name is known
to be offered, arguments streamed after, unoffered calls turned into content text when the reply
finishes, calls renumbered from 0), and usage taken off every chunk (``ChatStream`` sends it once).

The fast path, :func:`fast_chunk`: most payloads of a stream are one token's text in the exact
shape our engine server writes (compact JSON, ``id``/``object``/``created``/``model``/``choices``
in that order, one choice whose delta holds only ``content`` or ``reasoning_content``, or a
completion choice holding only ``text``). A full-match regular expression recognises that shape,
JSON string grammar included, and answers what the typed parse would (the same events, the same
"first token seen") without parsing; any other payload takes the typed parse. The two are fed the
same payloads in ``tests/unit/api/test_chunks.py``. Written here because it is the gateway's own
per-token hot path; pydantic does the typed parse.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from sparkfold.api.errors import UpstreamError, error_body
from sparkfold.api.tools import Toolbox
from sparkfold.protocol import ChatCompletionChunk, Completion, ErrorResponse, ToolCallDelta, field_error

__all__ = ["ChunkModel", "ChunkReader", "fast_chunk"]

ChunkModel = type[ChatCompletionChunk] | type[Completion]
Event = bytes | dict[str, Any]

# One character of a JSON string, as UTF-8 (RFC 3629: no surrogates, no overlong forms): what
# the typed parse's json.loads would decode. Raw control characters, '"' and '\\' are not one.
_CHAR = (  # a run of ASCII first: one step per run, not per character
    rb"(?:[\x20\x21\x23-\x5b\x5d-\x7f]++|[\xc2-\xdf][\x80-\xbf]|\xe0[\xa0-\xbf][\x80-\xbf]"
    rb"|[\xe1-\xec\xee\xef][\x80-\xbf]{2}|\xed[\x80-\x9f][\x80-\xbf]|\xf0[\x90-\xbf][\x80-\xbf]{2}"
    rb"|[\xf1-\xf3][\x80-\xbf]{3}|\xf4[\x80-\x8f][\x80-\xbf]{2})"
)
_ESCAPE = rb'\\["\\/bfnrt]|\\u(?![dD][89abAB])[0-9a-fA-F]{4}'  # \\u escapes of surrogates: the typed parse's
_STRING = rb'"(?:' + _CHAR + rb"|" + _ESCAPE + rb')*+"'
_NAME = rb'"' + _CHAR + rb'*+"'
_FAST = re.compile(
    rb'\{"id":(' + _NAME + rb'),"object":"(?:(chat\.completion\.chunk)|text_completion)",'
    rb'"created":(0|[1-9][0-9]{0,14}),"model":(' + _NAME + rb'),"choices":\[\{"index":0,'
    rb'(?:"delta":\{"(content|reasoning_content)":(' + _STRING + rb')\}|"text":(' + _STRING + rb"))\}\]\}"
)


_STRING_ONLY = re.compile(_STRING)
_TAIL = {b"content": b"}}]}", b"reasoning_content": b"}}]}", b"text": b"}]}"}


def fast_chunk(payload: bytes, model: ChunkModel) -> tuple[Event, bool, re.Match[bytes]] | None:
    """``(event, has_text, match)`` for a one-token payload of the shape our engine server writes,
    as the typed parse would answer it; ``None`` for any other payload (the typed parse's job)."""
    found = _FAST.fullmatch(payload)
    if found is None:
        return None
    chat, field = found.group(2, 5)
    if (chat is not None) != (model is ChatCompletionChunk):
        return None  # a chat chunk on a completions stream (or the reverse): the typed parse refuses it
    start, end = found.span(6) if chat is not None else found.span(7)
    event, has_text = _token_event(payload, field or b"text", start, end)
    return event, has_text, found


def _token_event(payload: bytes, field: bytes, start: int, end: int) -> tuple[Event, bool]:
    """A one-token payload whose text (a JSON string) spans ``start:end``: passed on as it is,
    a reasoning delta with its alias spliced in beside it (the same string, so no parse)."""
    if field == b"reasoning_content":
        return payload[:end] + b',"reasoning":' + payload[start:end] + payload[end:], end - start > 2
    return payload, end - start > 2


def _fast_head(found: re.Match[bytes]) -> dict[str, Any]:
    """The skeleton of a chunk the fast path took, as the typed parse reads it."""
    ident, chat, created, model = found.group(1, 2, 3, 4)
    kind = "chat.completion.chunk" if chat is not None else "text_completion"
    return {"id": json.loads(ident), "object": kind, "created": int(created), "model": json.loads(model)}


class _PendingCall:
    __slots__ = ("arguments", "id", "index", "name")

    def __init__(self) -> None:
        self.id: str | None = None
        self.name: str | None = None
        self.arguments = ""
        self.index: int | None = None
        """Its index in our stream once announced (an offered call); ``None`` while held."""


class ChunkReader:
    """The payloads of one engine stream, read in order; ``fast=False`` turns the fast path off."""

    def __init__(
        self,
        toolbox: Toolbox,
        *,
        model: ChunkModel = ChatCompletionChunk,
        on_text: Callable[[], None] = lambda: None,
        fast: bool = True,
    ) -> None:
        self._toolbox = toolbox
        self._model = model
        self._on_text = on_text
        self._fast = fast
        self._prefixes: list[tuple[bytes, bytes]] = []
        """Per text field, the bytes before the text of a chunk the full fast path took."""
        self._first = True
        self._pending: dict[int, _PendingCall] = {}
        self._calls_sent = 0
        self.head: dict[str, Any] = {}
        """The first parsed chunk's ``id``, ``object``, ``created`` and ``model``."""
        self.usage: dict[str, Any] | None = None
        """The last usage the engine sent (taken off its chunk)."""
        self.errored = False

    def read(self, payload: bytes) -> list[Event]:
        """The chat events one payload becomes (none, one, or several)."""
        if self._fast:
            for field, prefix in self._prefixes:  # the stream's own head, matched before: only the text
                if payload.startswith(prefix):
                    start, end = len(prefix), len(payload) - len(_TAIL[field])
                    if payload.endswith(_TAIL[field]) and _STRING_ONLY.fullmatch(payload, start, end):
                        return self._token(*_token_event(payload, field, start, end))
                    break
            fast = fast_chunk(payload, self._model)
            if fast is not None:
                event, has_text, found = fast
                if not self.head:
                    self.head = _fast_head(found)
                field = found.group(5) or b"text"
                if len(self._prefixes) < len(_TAIL) and field not in dict(self._prefixes):
                    self._prefixes.append((field, payload[: found.start(6 if field != b"text" else 7)]))
                return self._token(event, has_text)
        return self._typed(payload)

    def _token(self, event: Event, has_text: bool) -> list[Event]:
        if has_text:
            self._text_seen()
        return [event]

    def _text_seen(self) -> None:
        if self._first:
            self._first = False
            self._on_text()

    def _malformed(self, what: str) -> list[Event]:
        self.errored = True
        return [{"error": error_body(UpstreamError(f"the engine sent {what}"))["error"]}]

    def _typed(self, payload: bytes) -> list[Event]:
        try:
            data = json.loads(payload)
        except ValueError:
            return self._malformed("a chunk that is not JSON")
        if not isinstance(data, dict):
            return self._malformed("a chunk that is not a JSON object")
        if "error" in data:
            try:
                ErrorResponse.model_validate(data)
            except ValidationError as exc:
                return self._malformed(f"a malformed error event: {field_error(exc)}")
            self.errored = True
            return [data]
        try:
            chunk = self._model.model_validate(data)
        except ValidationError as exc:
            return self._malformed(f"a malformed chunk: {field_error(exc)}")
        if not self.head:
            self.head = _skeleton(data)
        changed = "usage" in data
        if changed:  # taken off every chunk; sent once at the end
            usage = data.pop("usage")
            self.usage = usage if usage is not None else self.usage
        if not chunk.choices:
            return []  # a usage chunk of the engine's own
        raw = data["choices"][0]
        if isinstance(chunk, Completion):
            if chunk.choices[0].text:
                self._text_seen()
            return [data if changed else payload]
        choice = chunk.choices[0]
        delta, raw_delta = choice.delta, raw["delta"]
        if delta.content or delta.reasoning_content or delta.tool_calls:
            self._text_seen()
        if delta.reasoning_content is not None:
            raw_delta["reasoning"] = delta.reasoning_content
            changed = True
        if "tool_calls" in raw_delta:
            del raw_delta["tool_calls"]
            changed = True
        out: list[Event] = self._collect(data, delta.tool_calls) if delta.tool_calls else []
        if choice.finish_reason:
            out += self._flush(data)
            if choice.finish_reason == "tool_calls" and self._calls_sent == 0:
                raw["finish_reason"] = "stop"
                changed = True
        if not delta.tool_calls or raw_delta or choice.finish_reason:
            out.append(data if changed else payload)  # unchanged: its own bytes, not re-encoded
        return out

    def _collect(self, chunk: dict[str, Any], deltas: list[ToolCallDelta]) -> list[Event]:
        out: list[Event] = []
        for item in deltas:
            call = self._pending.setdefault(item.index, _PendingCall())
            call.id = item.id or call.id
            function = item.function or {}
            name, piece = function.get("name"), function.get("arguments")
            call.name = name if isinstance(name, str) and name else call.name
            piece = piece if isinstance(piece, str) else ""
            if call.index is not None:  # announced: its arguments stream as they come
                if piece:
                    out.append(
                        self._tool_delta(chunk, {"index": call.index, "function": {"arguments": piece}})
                    )
                continue
            call.arguments += piece
            if call.name is not None and self._toolbox.offers(call.name):
                call.index = self._calls_sent
                self._calls_sent += 1
                first = {
                    "index": call.index,
                    "id": call.id or f"call_{call.index}",
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                out.append(self._tool_delta(chunk, first))
        return out

    def _tool_delta(self, chunk: dict[str, Any], call: dict[str, Any]) -> dict[str, Any]:
        return {**_skeleton(chunk), "choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}

    def _flush(self, chunk: dict[str, Any]) -> list[Event]:
        """The reply finished: the held calls (not offered, or never named) become content text."""
        out: list[Event] = []
        for index in sorted(self._pending):
            call = self._pending.pop(index)
            if call.index is not None:
                continue
            text = self._toolbox.as_text(call.name, call.arguments or "{}")
            out.append({**_skeleton(chunk), "choices": [{"index": 0, "delta": {"content": text}}]})
        return out


def _skeleton(chunk: dict[str, Any]) -> dict[str, Any]:
    return {key: chunk[key] for key in ("id", "object", "created", "model") if key in chunk}
