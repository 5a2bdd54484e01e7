"""The engine's chat stream, cleaned: the one streamed chat pipeline every dialect consumes.

:class:`ChatStream` reads an open engine stream and yields lists of *chat events*, one list
per network read (so a busy stream costs one hop per read, not per token):

``bytes`` a chunk's JSON text, unchanged (plain content deltas, and any chunk with nothing to
          rewrite, are passed on as the engine sent them: never re-encoded)
``dict``  a chunk that was rewritten (reasoning alias, tool-call hygiene), or ``{"error": {...}}``
``None``  nothing arrived for ``keepalive_s``: send a keepalive
``DONE``  always last

Tool calls stream: a call's first delta goes out as soon as its name is known to be offered (id,
name and the arguments so far), then each piece of its arguments as it arrives, so a client sees
a long call being written instead of seconds of nothing. A call to a tool that was not offered
is held and becomes content text when the reply finishes (tool-call hygiene: the gateway's job,
:mod:`sparkfold.api.tools`, whatever the engine). Calls are renumbered from 0 in the order they
were announced. Usage is counted once, as OpenAI sends it: whatever chunks the engine put it on,
it is taken off them and, with ``include_usage``, sent alone in a last chunk with empty ``choices``
before ``DONE``. An upstream failure after the stream opened becomes one error event, and the
stream still ends with ``DONE``.
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
# A plain delta that carries text (a role chunk does not): the first one is the first token.
_HAS_TEXT = re.compile(rb'"(?:content|text)"\s*:\s*"(?!")')


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
    __slots__ = ("arguments", "id", "index", "name")

    def __init__(self) -> None:
        self.id: str | None = None
        self.name: str | None = None
        self.arguments = ""
        self.index: int | None = None
        """Its index in our stream once announced (an offered call); ``None`` while held."""


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
        include_usage: bool = False,
    ) -> None:
        self._upstream = upstream
        self._include_usage = include_usage
        self._head: dict[str, Any] = {}  # the first parsed chunk's id, object, created, model
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
                        if self._first and _HAS_TEXT.search(payload) is not None:
                            self._token_seen()
                        batch.append(payload)
                    else:
                        batch += self._rewrite(payload)
                if done:
                    yield [*batch, *self._usage_events(), DONE]
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
            self._usage_events()  # counted even when the stream failed
            yield [DONE]
            return
        # Read the engine's body to its end (normally at once): a fully read response lets its
        # connection go back to the pool instead of being closed, saving a connect per request.
        with contextlib.suppress(ApiError):
            await self._upstream.finish(DRAIN_S)

    def _usage_events(self) -> list[ChatEvent]:
        """The one usage chunk (when asked for), counting the usage once."""
        if self.usage is None:
            return []
        self._on_usage(self.usage)
        return [{**self._head, "choices": [], "usage": self.usage}] if self._include_usage else []

    def _token_seen(self) -> None:
        if self._first:
            self._first = False
            self._upstream.first_token()
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
        if not self._head:
            self._head = self._skeleton(chunk)
        changed = False
        if "usage" in chunk:  # taken off every chunk; sent once at the end
            usage = chunk.pop("usage")
            changed = True
            if isinstance(usage, dict):
                self.usage = usage
        choices = chunk.get("choices")
        if isinstance(choices, list) and not choices:
            return []  # a usage chunk of the engine's own
        if not isinstance(choices, list) or not isinstance(choices[0], dict):
            return [chunk if changed else payload]
        choice = choices[0]
        delta = choice.get("delta")
        if not isinstance(delta, dict):  # a completions chunk (``text``): nothing to rewrite
            if choice.get("text"):
                self._token_seen()
            return [chunk if changed else payload]
        out: list[ChatEvent] = []
        if delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"):
            self._token_seen()
        if delta.get("reasoning_content") is not None:
            delta["reasoning"] = delta["reasoning_content"]
            changed = True
        calls = delta.pop("tool_calls", None)
        if calls is not None:
            changed = True
        if calls:
            out += self._collect(chunk, calls)
        if choice.get("finish_reason"):
            out += self._flush(chunk)
            if choice["finish_reason"] == "tool_calls" and self._calls_sent == 0:
                choice["finish_reason"] = "stop"
                changed = True
        if not calls or delta or choice.get("finish_reason"):
            out.append(chunk if changed else payload)  # unchanged: its own bytes, not re-encoded
        return out

    def _collect(self, chunk: dict[str, Any], deltas: Any) -> list[ChatEvent]:
        out: list[ChatEvent] = []
        for item in deltas if isinstance(deltas, list) else []:
            if not isinstance(item, dict):
                continue
            index = item.get("index", 0) if isinstance(item.get("index"), int) else 0
            call = self._pending.setdefault(index, _PendingCall())
            call.id = item.get("id") or call.id
            function: dict[str, Any] = item["function"] if isinstance(item.get("function"), dict) else {}
            call.name = function.get("name") or call.name
            piece = function["arguments"] if isinstance(function.get("arguments"), str) else ""
            if call.index is not None:  # announced: its arguments stream as they come
                if piece:
                    more = {"index": call.index, "function": {"arguments": piece}}
                    out.append(self._tool_delta(chunk, more))
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
        return {**self._skeleton(chunk), "choices": [{"index": 0, "delta": {"tool_calls": [call]}}]}

    @staticmethod
    def _skeleton(chunk: dict[str, Any]) -> dict[str, Any]:
        return {key: chunk[key] for key in ("id", "object", "created", "model") if key in chunk}

    def _flush(self, chunk: dict[str, Any]) -> list[ChatEvent]:
        """The reply finished: the held calls (not offered, or never named) become content text."""
        out: list[ChatEvent] = []
        for index in sorted(self._pending):
            call = self._pending.pop(index)
            if call.index is not None:
                continue
            text = self._toolbox.as_text(call.name, call.arguments or "{}")
            out.append({**self._skeleton(chunk), "choices": [{"index": 0, "delta": {"content": text}}]})
        return out
