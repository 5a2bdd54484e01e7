"""The engine's chat stream, cleaned: the one streamed chat pipeline every dialect consumes.

:class:`ChatStream` reads an open engine stream and yields lists of *chat events*, one list
per network read (so a busy stream costs one hop per read, not per token):

``bytes`` a chunk's JSON text, unchanged (plain content deltas, and any chunk with nothing to
          rewrite, are passed on as the engine sent them: never re-encoded)
``dict``  a chunk that was rewritten (reasoning alias, tool-call hygiene), or ``{"error": {...}}``
``None``  nothing arrived for ``keepalive_s``: send a keepalive
``DONE``  always last

Tool-call deltas are held until the call is complete (the next call starts or the reply
finishes), then sent whole, typed by the offered schema; a call to a tool that was not offered
becomes content text. An upstream failure after the stream opened becomes one error event, and
the stream still ends with ``DONE``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import AsyncIterable, AsyncIterator, Callable
from typing import Any, Final

from sparkfold.api.errors import ApiError, UpstreamError, error_body
from sparkfold.api.streaming import upstream_events
from sparkfold.api.tools import Toolbox
from sparkfold.api.upstream import EngineStream

log = logging.getLogger(__name__)

__all__ = ["DONE", "ChatEvent", "ChatStream", "as_chunk", "choices_of", "each_event", "is_text"]


class _Done:
    def __repr__(self) -> str:
        return "DONE"


DONE: Final = _Done()
ChatEvent = bytes | dict[str, Any] | None | _Done

DRAIN_S = 0.5  # the longest wait for the engine to end its body after [DONE]

# A payload where none of these keys has a non-null value is a plain delta, passed through untouched.
_NEEDS_PARSING = re.compile(rb'"(?:reasoning_content|tool_calls|usage|finish_reason|error)"\s*:\s*+(?!null)')


async def each_event(batches: AsyncIterable[list[ChatEvent]]) -> AsyncIterator[ChatEvent]:
    """The events of ``batches`` one by one (for translators that work per event)."""
    async for batch in batches:
        for event in batch:
            yield event


def choices_of(chunk: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """``(choice, delta)`` pairs of a chunk, skipping anything that is not shaped like one."""
    choices = chunk.get("choices")
    pairs = []
    for choice in choices if isinstance(choices, list) else []:
        if isinstance(choice, dict):
            delta = choice.get("delta")
            pairs.append((choice, delta if isinstance(delta, dict) else {}))
    return pairs


def is_text(value: object) -> bool:
    """A non-empty text delta (anything else from the engine is not text and is skipped)."""
    return isinstance(value, str) and value != ""


def as_chunk(event: bytes | dict[str, Any]) -> dict[str, Any]:
    """A chat event as a chunk dict; a payload that is not a JSON object becomes an error chunk."""
    if isinstance(event, dict):
        return event
    try:
        chunk = json.loads(event)
    except ValueError:
        chunk = None
    if isinstance(chunk, dict):
        return chunk
    return {"error": error_body(UpstreamError("the engine sent a chunk that is not a JSON object"))["error"]}


class _PendingCall:
    __slots__ = ("arguments", "id", "name")

    def __init__(self) -> None:
        self.id: str | None = None
        self.name: str | None = None
        self.arguments = ""


class ChatStream:
    """An open streamed chat completion; iterate it once, then :meth:`aclose`."""

    def __init__(
        self,
        upstream: EngineStream,
        *,
        keepalive_s: float,
        toolbox: Toolbox,
        on_first_token: Callable[[], None] = lambda: None,
        on_usage: Callable[[Any], None] = lambda usage: None,
    ) -> None:
        self._upstream = upstream
        self._keepalive_s = keepalive_s
        self._toolbox = toolbox
        self._on_first_token = on_first_token
        self._on_usage = on_usage
        self._first = True
        self._pending: dict[int, _PendingCall] = {}
        self._calls_sent = 0
        self.usage: dict[str, Any] | None = None
        self.errored = False

    async def aclose(self) -> None:
        await self._upstream.aclose()

    def __aiter__(self) -> AsyncIterator[list[ChatEvent]]:  # an AsyncIterable of batches
        return self._batches()

    async def _batches(self) -> AsyncIterator[list[ChatEvent]]:
        done = False
        events = upstream_events(self._upstream.read, self._keepalive_s)
        try:
            async for payloads in events:
                if payloads is None:
                    yield [None]
                    continue
                batch: list[ChatEvent] = []
                for payload in payloads:
                    if payload == b"[DONE]":
                        done = True
                        break
                    if _NEEDS_PARSING.search(payload) is None:
                        self._token_seen()
                        batch.append(payload)
                    else:
                        batch += self._rewrite(payload)
                if done:
                    yield [*batch, DONE]
                    break
                if batch:
                    yield batch
        except ApiError as exc:
            if not self.errored:
                self.errored = True
                yield [{"error": error_body(exc)["error"]}]
        except Exception:
            log.exception("stream relay failed")
            self.errored = True
            yield [{"error": error_body(UpstreamError("the gateway failed relaying the stream"))["error"]}]
        else:
            if not done and not self.errored:
                self.errored = True
                error = UpstreamError("the engine closed the stream before it finished")
                yield [{"error": error_body(error)["error"]}]
        if not done:
            yield [DONE]
            return
        # Read the engine's body to its end (normally at once): a fully read response lets its
        # connection go back to the pool instead of being closed, saving a connect per request.
        with contextlib.suppress(ApiError):
            await self._upstream.finish(DRAIN_S)

    def _token_seen(self) -> None:
        if self._first:
            self._first = False
            self._on_first_token()

    def _rewrite(self, payload: bytes) -> list[ChatEvent]:
        try:
            chunk = json.loads(payload)
        except ValueError:
            chunk = None
        if not isinstance(chunk, dict):
            self.errored = True
            return [{"error": error_body(UpstreamError("the engine sent a chunk that is not JSON"))["error"]}]
        if "error" in chunk:
            self.errored = True
            return [chunk]
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
            self._on_usage(chunk["usage"])
        choices = chunk.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return [payload]
        choice = choices[0]
        delta = choice.get("delta")
        if not isinstance(delta, dict):  # a completions chunk (``text``): nothing to rewrite
            if choice.get("text"):
                self._token_seen()
            return [payload]
        out: list[ChatEvent] = []
        if delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"):
            self._token_seen()
        changed = False
        if delta.get("reasoning_content") is not None:
            delta["reasoning"] = delta["reasoning_content"]
            changed = True
        calls = delta.pop("tool_calls", None)
        if calls is not None:
            changed = True
        if calls:
            out += self._collect(chunk, calls)
        if choice.get("finish_reason"):
            out += self._flush(chunk, upto=None)
            if choice["finish_reason"] == "tool_calls" and self._calls_sent == 0:
                choice["finish_reason"] = "stop"
                changed = True
        if not calls or delta or choice.get("finish_reason") or "usage" in chunk:
            out.append(chunk if changed else payload)  # unchanged: its own bytes, not re-encoded
        return out

    def _collect(self, chunk: dict[str, Any], deltas: Any) -> list[ChatEvent]:
        out: list[ChatEvent] = []
        for item in deltas if isinstance(deltas, list) else []:
            if not isinstance(item, dict):
                continue
            index = item.get("index", 0) if isinstance(item.get("index"), int) else 0
            if index not in self._pending:
                out += self._flush(chunk, upto=index)  # a new call starts: the earlier ones are whole
                self._pending[index] = _PendingCall()
            call = self._pending[index]
            call.id = item.get("id") or call.id
            function: dict[str, Any] = item["function"] if isinstance(item.get("function"), dict) else {}
            call.name = function.get("name") or call.name
            if isinstance(function.get("arguments"), str):
                call.arguments += function["arguments"]
        return out

    def _flush(self, chunk: dict[str, Any], upto: int | None) -> list[ChatEvent]:
        ready = sorted(i for i in self._pending if upto is None or i < upto)
        out: list[ChatEvent] = []
        for index in ready:
            call = self._pending.pop(index)
            raw: dict[str, Any] = {
                "id": call.id or f"call_{index}",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            kept, text = self._toolbox.clean_calls([raw])
            skeleton: dict[str, Any] = {
                key: chunk[key] for key in ("id", "object", "created", "model") if key in chunk
            }
            if kept:
                tool_delta = {"index": self._calls_sent, **kept[0]}
                self._calls_sent += 1
                delta: dict[str, Any] = {"tool_calls": [tool_delta]}
            else:
                delta = {"content": text}
            out.append({**skeleton, "choices": [{"index": 0, "delta": delta}]})
        return out
