"""Prefix reuse: each lane keeps its KV cache after a request, and the next request that starts
with the same tokens reads only the rest of its prompt.

A :class:`SlotCache` holds one KV cache (a transformers ``DynamicCache``) and the token ids it has
seen. Reuse resumes at a *mark*: the end of a prompt chunk of exactly ``block`` tokens (the
engine's ``prefill_chunk_tokens``) that followed the previous mark, counted from the start. A cold
prompt is read in those same chunks, so a reused prompt runs the very forwards a cold one runs
from the mark on, over a cache that holds exactly what the cold one's would: greedy replies,
and their log-probabilities, are equal bit for bit. A prompt read in one forward
(``prefill_chunk_tokens = 0``) or with pictures sets no mark.

Going back to a mark needs two mechanisms, because a model's cache layers are of two kinds:

* full-attention layers, whose keys grow by one row a token (``transformers.cache_utils``
  ``DynamicLayer``, and ``DynamicIndexedLayer`` with its indexer keys), are cut with their own
  ``crop(-tokens)`` (``DynamicLayer.crop`` takes a negative count in the installed transformers);
* every other layer (linear attention's recurrent and conv state, sliding windows) folds its past
  into a fixed-size state that cannot be cut back (``LinearAttentionCacheLayerMixin.crop`` raises
  unless past recording was on while the tokens went in). Those are copied at each mark and the
  copy is restored.

Memory is bounded by ``keep_tokens``: no mark is set past it, and a released lane is cut back
to its last mark (0: nothing is kept).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["SlotCache", "common_prefix"]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading token ids ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def _croppable(layer: Any) -> bool:
    """A layer whose ``crop`` cuts it back exactly: full attention, keys growing by token."""
    from transformers.cache_utils import DynamicLayer, LinearAttentionCacheLayerMixin

    return (
        isinstance(layer, DynamicLayer)
        and not layer.is_sliding
        and not isinstance(layer, LinearAttentionCacheLayerMixin)
    )


class SlotCache:
    """One lane's KV cache, the token ids in it, and the marks where a later request may resume."""

    def __init__(self, new_cache: Callable[[], Any], *, block: int, keep_tokens: int) -> None:
        self._new_cache = new_cache
        self.block = block
        """Tokens per prompt chunk; a mark ends each whole chunk (0: no marks, no reuse)."""
        self.keep_tokens = keep_tokens
        """At most this many tokens are kept, and marked (0: no reuse)."""
        self.cache: Any = new_cache()
        self.ids: list[int] = []
        self._marks: dict[int, dict[int, Any]] = {}
        """Mark position -> copies of the layers ``crop`` cannot cut back, as they were there."""

    def reusable(self, prompt: Sequence[int]) -> int:
        """The prompt tokens this lane's cache can stand for: its last mark inside the common
        prefix, short of the whole prompt (at least one token must be read for the next logits)."""
        shared = min(common_prefix(self.ids, prompt), len(prompt) - 1)
        return max((mark for mark in self._marks if mark <= shared), default=0)

    def keep(self, tokens: int) -> None:
        """Go back to ``tokens`` (0 or a mark): a new request resumes there."""
        if tokens == 0:
            self.cache, self.ids, self._marks = self._new_cache(), [], {}
            return
        if tokens not in self._marks:
            raise ValueError(f"no mark at {tokens} tokens (marks: {sorted(self._marks)})")
        cut = len(self.ids) - tokens
        for index, layer in enumerate(self.cache.layers):
            saved = self._marks[tokens].get(index)
            if saved is not None:
                self.cache.layers[index] = copy.deepcopy(saved)  # the copy stays for the next reuse
            elif cut:
                layer.crop(-cut)
        del self.ids[tokens:]
        self._marks = {mark: layers for mark, layers in self._marks.items() if mark <= tokens}

    def fed(self, ids: Sequence[int]) -> None:
        """``ids`` went into the cache; a whole chunk right after the last mark sets a new mark."""
        start = len(self.ids)
        self.ids.extend(ids)
        last = max(self._marks, default=0)
        end = len(self.ids)
        if self.block and len(ids) == self.block and start == last and end <= self.keep_tokens:
            self._marks[end] = {
                index: copy.deepcopy(layer)
                for index, layer in enumerate(self.cache.layers)
                if not _croppable(layer)
            }

    def unmarked(self) -> None:
        """What went in is more than its token ids (pictures): nothing here may be reused (no mark
        follows either, as a mark needs a chunk from the previous one)."""
        self._marks = {}

    def release(self) -> None:
        """The request is over: keep what reaches its last mark (the reply and the rest of the
        prompt are never reused), at most ``keep_tokens``."""
        last = max(self._marks, default=0)
        if last < len(self.ids):
            self.keep(last)
