"""From reply token ids to message deltas.

:class:`TextStream` decodes token ids incrementally (never splitting a multi-byte character)
and applies stop strings, holding back text that might be the start of one. An
:class:`OutputParser` then turns the text into ``content`` / ``reasoning_content`` / tool-call
deltas; the default :class:`PlainParser` calls everything content. The GLM parser in
``sparkfold.glm`` (``<think>`` split, tool calls) implements the same protocol.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from sparkfold.config import FORCED_CALLS_PER_TOOL
from sparkfold.protocol import ChatCompletionRequest, Delta

__all__ = ["OutputParser", "ParserFactory", "PlainParser", "TextStream"]


class OutputParser(Protocol):
    """Splits reply text into deltas. ``finish`` flushes what it held back."""

    @property
    def tool_calls_made(self) -> bool:
        """True once a tool call was emitted (the finish reason becomes ``tool_calls``)."""
        ...

    @property
    def ended(self) -> bool:
        """True once the reply is over by the parser's rules (the GLM parser's bound on calls):
        the engine stops generating, as at a stop token."""
        ...

    def feed(self, text: str) -> list[Delta]: ...

    def finish(self, finish_reason: str | None = None) -> list[Delta]:
        """End of reply (``"length"``: it was cut off, so an open tool call ends where it was cut)."""
        ...


ParserFactory = Callable[[ChatCompletionRequest], OutputParser]


class PlainParser:
    """Everything the model writes is ``content``."""

    tool_calls_made = False
    ended = False

    def feed(self, text: str) -> list[Delta]:
        return [Delta(content=text)] if text else []

    def finish(self, finish_reason: str | None = None) -> list[Delta]:
        return []


def plain_parser(request: ChatCompletionRequest, per_tool: int = FORCED_CALLS_PER_TOOL) -> OutputParser:
    """Content, and ``<tool_call>`` JSON calls when the request offers tools (forced ones bounded
    at ``per_tool`` × offered tools, ``[engine] forced_calls_per_tool``, as GLM's are)."""
    if request.tools and request.tool_choice != "none":
        from sparkfold.engines.template_tools import ToolCallParser
        from sparkfold.glm.chat import forced_call_cap

        return ToolCallParser(request.tools, max_calls=forced_call_cap(request, per_tool))
    return PlainParser()


class TextStream:
    """Incremental detokenizer with stop strings.

    ``push(token_id)`` returns the text that is now final; ``stopped`` turns true when a stop
    string appeared (the stop string and everything after it are dropped). Each step decodes only
    a short window (the previous token onwards, compared with the same window without the new
    token), so a long reply costs linear time, and tokenizers that treat a leading space
    specially still join up correctly.
    """

    def __init__(self, decode: Callable[[Sequence[int]], str], stop: Sequence[str] = ()) -> None:
        self._decode = decode
        self._stop = [s for s in stop if s]
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self._ids: list[int] = []
        self._prefix = 0  # window start: ids before it are decoded for good
        self._read = 0  # ids before it are in self._text
        self._text = ""  # final text so far
        self._sent = 0  # characters of self._text already returned
        self.stopped = False
        self.matched: str | None = None
        """The stop string that ended the reply (vLLM's ``stop_reason``)."""

    def push(self, token_id: int) -> str:
        if self.stopped:
            return ""
        self._ids.append(token_id)
        if not self._advance(final=False):
            return ""  # an incomplete multi-byte character: wait for the next token
        for stop in self._stop:
            at = self._text.find(stop, max(0, self._sent - len(stop)))
            if at >= 0:
                self.stopped, self.matched = True, stop
                return self._take(at)
        return self._take(max(self._sent, len(self._text) - self._hold))

    def flush(self) -> str:
        """The held-back tail once the reply ended without a stop string."""
        if self.stopped:
            return ""
        self._advance(final=True)
        return self._take(len(self._text))

    def _advance(self, final: bool) -> bool:
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        if not final and (after.endswith("\ufffd") or len(after) <= len(before)):
            return False
        self._text += after[len(before) :]
        self._prefix, self._read = self._read, len(self._ids)
        return True

    def _take(self, end: int) -> str:
        end = max(end, self._sent)
        out = self._text[self._sent : end]
        self._sent = end
        return out
