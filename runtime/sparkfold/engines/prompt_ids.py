"""Token ids of recently seen long prompts, so a prompt sent again is not tokenized again.

An identical long prompt sent a second time (an agent's retry, a client re-sending a long
context, the recipe's re-send figure) would be tokenized in full again before the engine reuses
its cached pages: with a fast tokenizer about 1 to 2 µs a token, so ~0.1 s at 64k tokens, which
is most of such a second visit's time to first token once every page is reused. Tokenizing is a
pure function of the text, so the ids of the last long prompts are kept, keyed by the text itself
(4 bytes a token, ``max_tokens`` in all, least recently used first out). Short prompts are
tokenized as before: cheap, and not worth the memory.
"""

from __future__ import annotations

import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable

__all__ = ["PromptIds"]

Encode = Callable[..., list[int]]


class PromptIds:
    """``encode(text, add_special_tokens=…)`` with the ids of recent long prompts kept."""

    def __init__(self, encode: Encode, *, min_chars: int = 16_384, max_tokens: int = 2_097_152) -> None:
        self._encode = encode
        self.min_chars = min_chars
        self.max_tokens = max_tokens
        self._kept: OrderedDict[tuple[str, bool], array[int]] = OrderedDict()
        self._tokens = 0
        self._lock = threading.Lock()
        self.hits = 0

    def __call__(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        if len(text) < self.min_chars:
            return self._encode(text, add_special_tokens=add_special_tokens)
        key = (text, add_special_tokens)
        with self._lock:
            kept = self._kept.get(key)
            if kept is not None:
                self._kept.move_to_end(key)
                self.hits += 1
                return kept.tolist()
        ids = self._encode(text, add_special_tokens=add_special_tokens)
        if len(ids) <= self.max_tokens:
            with self._lock:
                if key not in self._kept:
                    self._kept[key] = array("i", ids)
                    self._tokens += len(ids)
                while self._tokens > self.max_tokens:
                    _, dropped = self._kept.popitem(last=False)
                    self._tokens -= len(dropped)
        return ids
