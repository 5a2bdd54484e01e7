"""A Hugging Face transformers ``LogitsProcessor`` over :class:`~sparkfold.glm.grammar.ConstrainedMatcher`.

One matcher per batch row. On each call the processor feeds every row's newest token to its
matcher (the first call sees only the prompt), then masks the row's logits (while a row still
reasons, only its stop tokens are masked).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import LogitsProcessor

from sparkfold.glm.grammar import ConstrainedMatcher, allocate_bitmask, apply_bitmask

__all__ = ["GrammarLogitsProcessor"]


class GrammarLogitsProcessor(LogitsProcessor):
    """Constrain ``generate`` with one matcher per row; ``prompt_length`` is the input width."""

    def __init__(self, matchers: Sequence[ConstrainedMatcher], prompt_length: int) -> None:
        self.matchers = list(matchers)
        self._seen = prompt_length
        self._bitmask = allocate_bitmask(self.matchers[0].vocab_size, len(self.matchers))

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        width = input_ids.shape[1]
        for step in range(self._seen, width):
            for row, matcher in enumerate(self.matchers):
                if not matcher.is_terminated():
                    matcher.accept_token(int(input_ids[row, step]))
        self._seen = width
        rows = [row for row, matcher in enumerate(self.matchers) if matcher.fill_bitmask(self._bitmask, row)]
        if rows:
            apply_bitmask(scores, self._bitmask, indices=rows)
        return scores
