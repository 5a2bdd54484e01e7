"""The engine's chat stream, cleaned: the one streamed chat pipeline every dialect consumes.

:class:`ChatStream` reads an open engine stream and yields lists of *chat events*, one list
per network read (so a busy stream costs one hop per read, not per token):

``bytes`` a chunk's JSON text as the engine sent it (a chunk with nothing to rewrite is never
          re-encoded; a one-token reasoning delta gets its alias spliced in)
``dict``  a chunk that was rewritten (reasoning alias, tool-call hygiene), or ``{"error": {...}}``
``None``  nothing arrived for ``keepalive_s``: send a keepalive
``DONE``  always last

Each payload is read through the engine protocol's models by :class:`~sparkfold.api.chunks.ChunkReader`
(with its proven fast path for one-token chunks): a chunk that does not follow them becomes one
error event naming the field.

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
from collections.abc import AsyncIterable, AsyncIterator, Callable
from typing import Any, Final

from sparkfold.api.chunks import ChunkModel, ChunkReader
from sparkfold.api.errors import ApiError, UpstreamError, error_body
from sparkfold.api.streaming import upstream_events
from sparkfold.api.tools import Toolbox
from sparkfold.api.upstream import EngineStream
from sparkfold.protocol import ChatCompletionChunk

log = logging.getLogger(__name__)

__all__ = ["DONE", "ChatEvent", "ChatStream", "as_chunk", "choices_of", "each_event", "is_text"]


class _Done:
    def __repr__(self) -> str:
        return "DONE"


DONE: Final = _Done()
ChatEvent = bytes | dict[str, Any] | None | _Done

DRAIN_S = 0.5  # the longest wait for the engine to end its body after [DONE]


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
        chunk_model: ChunkModel = ChatCompletionChunk,
    ) -> None:
        self._upstream = upstream
        self._include_usage = include_usage
        self._keepalive_s = keepalive_s
        self._on_first_token = on_first_token
        self._on_usage = on_usage
        self._chunks = ChunkReader(toolbox, model=chunk_model, on_text=self._token_seen)
        self.errored = False

    @property
    def usage(self) -> dict[str, Any] | None:
        """The reply's usage, once the engine sent it."""
        return self._chunks.usage

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
                    batch += self._chunks.read(payload)
                self.errored = self.errored or self._chunks.errored
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
        return [{**self._chunks.head, "choices": [], "usage": self.usage}] if self._include_usage else []

    def _token_seen(self) -> None:  # once: the reader calls it on the first text
        self._upstream.first_token()
        self._on_first_token()
