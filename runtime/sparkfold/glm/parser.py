"""GLM-5.3 output parsing, streaming or not: reasoning, content and tool calls.

Feed decoded text (special tokens kept) as it arrives; each :meth:`GlmParser.feed` returns a
:class:`ParsedDelta`. The rules (reference ``glm.md`` 6.2, 7, 8):

* The prompt opens ``<think>`` (thinking on), so text up to ``</think>`` is reasoning; with
  thinking off everything is content (a ``<think>`` before any content still opens reasoning).
* ``<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>…</tool_call>`` streams as it is
  generated (:mod:`sparkfold.glm.calls`): its name once known, then its JSON arguments, string
  values piece by piece, other values typed by the offered schema as each closes. A call cut off
  by the token budget (``finish(truncated=True)``) ends with what was generated (its arguments
  an unfinished JSON text); a call that a stop token ends without ``</tool_call>`` is complete.
* A reply's calls are bounded: a call identical to an earlier one of the reply is dropped and ends
  the reply, and so does reaching ``max_calls`` (the engine stops on :attr:`GlmParser.finished`).
* A call written inside the think block is a call: ``<tool_call>`` ends the reasoning there
  (what the model meant) and a later stray ``</think>`` is dropped.
* Malformed calls seen in production are repaired where the intent is clear (missing
  ``<arg_value>`` / ``<arg_key>`` openers, doubled closers, the JSON form ``NAME>{…}``,
  display names like ``Weather/get_weather``); a call to a tool the request did not offer, or one
  that cannot be read, is not returned as a call (it is kept in :attr:`GlmParser.rejected`):
  the name is known before any piece of the call goes out, so nothing of it is ever sent.
* ``<|endoftext|>``, ``<|user|>``, ``<|observation|>`` and ``<|assistant|>`` end the reply and
  never reach the text, nor do stray call tags outside a call, nor any other control token
  (``<|end_of_transcription|>`` …); leading and trailing whitespace of each channel is dropped.

The result does not depend on how the text is split into pieces.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sparkfold.glm.calls import CallWriter, ParsedToolCall, ToolCallPiece
from sparkfold.glm.tokens import (
    SPECIAL_TOKENS,
    STOP_TOKENS,
    THINK,
    THINK_END,
    TOOL_CALL,
    TOOL_CALL_END,
    partial_tag,
)
from sparkfold.protocol import Delta

__all__ = ["GlmParser", "ParsedDelta", "ParsedMessage", "ParsedToolCall", "ToolCallPiece", "parse_output"]

_STRAY_TAGS = (
    TOOL_CALL_END,
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
)  # dropped outside a call
_SKIPPED_TAGS = tuple(
    t for t in SPECIAL_TOKENS if t not in (THINK, THINK_END, TOOL_CALL, *STOP_TOKENS, *_STRAY_TAGS)
)  # other control tokens (``<|end_of_transcription|>`` …): never reply text, as vLLM skips them
_OUTSIDE_TAGS = (THINK, THINK_END, TOOL_CALL, *STOP_TOKENS, *_STRAY_TAGS, *_SKIPPED_TAGS)
_INSIDE_TAGS = (TOOL_CALL_END, TOOL_CALL, *STOP_TOKENS)


@dataclass
class ParsedDelta:
    reasoning: str = ""
    content: str = ""
    tool_calls: list[ToolCallPiece] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (self.reasoning or self.content or self.tool_calls)

    def to_delta(self) -> Delta:
        """The wire delta: a call's first piece carries its id, type and name (OpenAI's shape)."""
        calls = [c.delta() for c in self.tool_calls]
        return Delta(
            reasoning_content=self.reasoning or None, content=self.content or None, tool_calls=calls or None
        )


@dataclass
class ParsedMessage:
    reasoning: str
    content: str
    tool_calls: list[ParsedToolCall]
    finish_reason: str


class _Channel:
    """One text channel: leading whitespace dropped, trailing whitespace held until more text."""

    def __init__(self) -> None:
        self.started = False
        self.held = ""

    def push(self, text: str) -> str:
        if not self.started:
            text = text.lstrip()
            if not text:
                return ""
            self.started = True
        text = self.held + text
        kept = text.rstrip()
        self.held = text[len(kept) :]
        return kept

    def cut(self) -> None:
        self.held = ""


def _first_tag(text: str, tags: Sequence[str]) -> tuple[int, str]:
    best, found = -1, ""
    for tag in tags:
        at = text.find(tag)
        if at != -1 and (best == -1 or at < best):
            best, found = at, tag
    return best, found


class GlmParser:
    """Incremental parser for one reply. ``tools`` are the offered tools (OpenAI shape);
    ``max_calls`` ends the reply once that many calls were made (forced calls: see
    :meth:`sparkfold.glm.chat.GlmChat.parser_for`)."""

    def __init__(
        self,
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        thinking: bool = True,
        id_factory: Callable[[], str] | None = None,
        max_calls: int | None = None,
    ) -> None:
        self._schemas: dict[str, Any] = {}
        for tool in tools or []:
            function = tool.get("function") or {}
            if function.get("name"):
                self._schemas[str(function["name"])] = function.get("parameters") or {}
        self._new_id = id_factory or (lambda: f"call_{uuid.uuid4().hex[:24]}")
        self._max_calls = max_calls
        self._mode = "reasoning" if thinking else "content"
        self._channels = {"reasoning": _Channel(), "content": _Channel()}
        self._pending = ""
        self._call: CallWriter | None = None
        self._truncated = False
        self.finished = False
        """The reply is over (a stop token, a repeated call, ``max_calls``): the engine may stop."""
        self.stop_token: str | None = None
        self.tool_calls: list[ParsedToolCall] = []
        self.rejected: list[str] = []
        self._reasoning: list[str] = []
        self._content: list[str] = []

    # --- public -------------------------------------------------------------------------------

    def feed(self, text: str) -> ParsedDelta:
        """Parse the next piece of decoded text."""
        delta = ParsedDelta()
        if self.finished or not text:
            return delta
        self._pending += text
        self._run(delta, final=False)
        return delta

    def finish(self, *, truncated: bool = False) -> ParsedDelta:
        """End of generation: ``truncated`` when the token budget ran out (an open call is cut)."""
        delta = ParsedDelta()
        if not self.finished:
            if self._mode == "call":
                self._close_call(self._pending, delta, cut=truncated)
                self._pending = ""
            else:
                self._run(delta, final=True)
        self.finished = True
        for channel in self._channels.values():
            channel.cut()
        self._truncated = truncated
        return delta

    @property
    def finish_reason(self) -> str:
        if self._truncated:
            return "length"
        return "tool_calls" if self.tool_calls else "stop"

    def message(self) -> ParsedMessage:
        """Everything parsed so far, as one message."""
        return ParsedMessage(
            reasoning="".join(self._reasoning),
            content="".join(self._content),
            tool_calls=list(self.tool_calls),
            finish_reason=self.finish_reason,
        )

    # --- internals ----------------------------------------------------------------------------

    def _emit(self, mode: str, text: str, delta: ParsedDelta) -> None:
        out = self._channels[mode].push(text)
        if not out:
            return
        if mode == "reasoning":
            delta.reasoning += out
            self._reasoning.append(out)
        else:
            delta.content += out
            self._content.append(out)

    def _stop(self, tag: str | None) -> None:
        self.finished = True
        self.stop_token = tag
        self._pending = ""

    def _run(self, delta: ParsedDelta, *, final: bool) -> None:
        while self._pending and not self.finished:
            if self._mode == "call":
                at, tag = _first_tag(self._pending, _INSIDE_TAGS)
                if at == -1:
                    keep = partial_tag(self._pending, _INSIDE_TAGS)
                    body = self._pending[: len(self._pending) - keep]
                    self._pending = self._pending[len(body) :]
                    delta.tool_calls += self._writer().feed(body)
                    return
                body, self._pending = self._pending[:at], self._pending[at + len(tag) :]
                self._close_call(body, delta)
                if self.finished:
                    return
                if tag == TOOL_CALL:
                    continue  # a new call opens without the previous one closing
                self._mode = "content"
                if tag in STOP_TOKENS:
                    self._stop(tag)
                continue
            at, tag = _first_tag(self._pending, _OUTSIDE_TAGS)
            if at == -1:
                keep = 0 if final else partial_tag(self._pending, _OUTSIDE_TAGS)
                text = self._pending[: len(self._pending) - keep]
                self._pending = self._pending[len(text) :]
                self._emit(self._mode, text, delta)
                return
            self._emit(self._mode, self._pending[:at], delta)
            self._pending = self._pending[at + len(tag) :]
            self._on_tag(tag)

    def _on_tag(self, tag: str) -> None:
        if tag in STOP_TOKENS:
            self._channels[self._mode].cut()
            self._stop(tag)
        elif tag == THINK_END:
            self._channels["reasoning"].cut()
            self._mode = "content"
        elif tag == THINK:
            if self._mode == "content" and not self._channels["content"].started:
                self._mode = "reasoning"
        elif tag == TOOL_CALL:
            self._channels[self._mode].cut()
            self._mode = "call"

    def _writer(self) -> CallWriter:
        if self._call is None:
            self._call = CallWriter(
                len(self.tool_calls),
                schemas=self._schemas,
                resolve=self._resolve,
                new_id=self._new_id,
                earlier=self.tool_calls,
            )
        return self._call

    def _close_call(self, body: str, delta: ParsedDelta, *, cut: bool = False) -> None:
        writer = self._writer()
        self._call = None
        delta.tool_calls += writer.feed(body)
        call, pieces = writer.close(cut=cut)
        delta.tool_calls += pieces
        if writer.repeated:
            self._stop(None)  # the model repeats itself: the reply is over
        elif call is None:
            self.rejected.append(writer.body)
        else:
            self.tool_calls.append(call)
            if self._max_calls is not None and len(self.tool_calls) >= self._max_calls:
                self._stop(None)

    def _resolve(self, name: str) -> str | None:
        name = name.strip().strip(">").strip()
        if name in self._schemas:
            return name
        for sep in ("/", "."):
            tail = name.rsplit(sep, 1)[-1].strip()
            if tail in self._schemas:
                return tail
        return None


def parse_output(
    text: str,
    tools: Sequence[Mapping[str, Any]] | None = None,
    *,
    thinking: bool = True,
    truncated: bool = False,
    id_factory: Callable[[], str] | None = None,
    max_calls: int | None = None,
) -> ParsedMessage:
    """Parse a whole reply at once (same rules as streaming)."""
    parser = GlmParser(tools, thinking=thinking, id_factory=id_factory, max_calls=max_calls)
    parser.feed(text)
    parser.finish(truncated=truncated)
    return parser.message()
