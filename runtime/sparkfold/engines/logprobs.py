"""Log-probabilities of reply tokens in OpenAI's two shapes (chat ``content`` list, completions columns).

The engine fills ``SamplingParams.logprobs_out`` (one :class:`~sparkfold.engines.generator.TokenLogprob`
per reply token, before it emits the token); a :class:`LogprobReader` hands the new entries to each
response chunk in order and leaves out the token that ended the reply (an end-of-sequence or stop
token is never reply text).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from sparkfold.engines.generator import SamplingParams, TokenLogprob

__all__ = ["LogprobReader", "chat_logprobs", "completion_logprobs"]

MAX_TOP_LOGPROBS = 20


class LogprobReader:
    """The entries of one reply, read in order."""

    def __init__(
        self, params: SamplingParams, decode: Callable[[Sequence[int]], str], ends: frozenset[int]
    ) -> None:
        self._entries = params.logprobs_out
        self._decode = decode
        self._ends = ends
        self._read = 0
        self.offset = 0
        """Characters of reply text described so far (completions' ``text_offset``)."""

    def take(self, *, final: bool = False) -> list[TokenLogprob]:
        """Entries that arrived since the last call; at the end without the reply-ending token."""
        new = self._entries[self._read :]
        self._read = len(self._entries)
        if final and new and new[-1].token in self._ends:
            new = new[:-1]
        elif not final and new and new[-1].token in self._ends:
            self._read -= 1  # maybe the end: decided at the final take
            new = new[:-1]
        return new

    def text(self, token: int) -> str:
        return self._decode([token])


def _entry(reader: LogprobReader, token: int, logprob: float) -> dict[str, Any]:
    text = reader.text(token)
    return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}


def chat_logprobs(reader: LogprobReader, entries: list[TokenLogprob]) -> dict[str, Any]:
    """``choices[].logprobs`` of a chat completion (or chunk)."""
    content = []
    for item in entries:
        entry = _entry(reader, item.token, item.logprob)
        entry["top_logprobs"] = [_entry(reader, token, lp) for token, lp in item.top]
        content.append(entry)
    return {"content": content}


def completion_logprobs(reader: LogprobReader, entries: list[TokenLogprob]) -> dict[str, Any]:
    """``choices[].logprobs`` of a completion (or chunk): parallel columns."""
    tokens, offsets = [], []
    for item in entries:
        text = reader.text(item.token)
        tokens.append(text)
        offsets.append(reader.offset)
        reader.offset += len(text)
    return {
        "tokens": tokens,
        "token_logprobs": [item.logprob for item in entries],
        "top_logprobs": [{reader.text(t): lp for t, lp in item.top} for item in entries],
        "text_offset": offsets,
    }
