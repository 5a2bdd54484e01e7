"""``thinking_budget``: at most N reasoning tokens, then ``</think>`` is the only token allowed.

:class:`ThinkingBudget` has the token-matcher shape both our engines already apply to every step
(``accept_token``, ``fill_bitmask``, ``rollback``, ``reset``, ``is_terminated``, ``dead_end``, ``vocab_size``:
the transformers engine masks the logits with it, exllamav3 wraps it in a ``Filter``), so the
budget needs no engine code of its own. It wraps the request's structured-output matcher, if any,
which itself waits for ``</think>``: while thinking the budget decides, after it the grammar.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ThinkingBudget"]


class ThinkingBudget:
    """At most ``budget`` tokens before ``think_end`` (the reply starts inside ``<think>``)."""

    def __init__(self, budget: int, think_end: int, vocab_size: int, inner: Any = None) -> None:
        self.budget = budget
        self.think_end = think_end
        self.vocab_size = vocab_size
        self.inner = inner
        self._history: list[bool] = []
        """Per accepted token: was it a reasoning token (before ``think_end``)?"""
        self._thinking = True

    @property
    def spent(self) -> int:
        return sum(self._history)

    def accept_token(self, token_id: int) -> bool:
        thinking = self._thinking
        if thinking and token_id == self.think_end:
            self._thinking = False
            thinking = False
        self._history.append(thinking)
        return True if self.inner is None else bool(self.inner.accept_token(token_id))

    def fill_bitmask(self, bitmask: Any, index: int = 0) -> bool:
        """Only ``think_end`` once the budget is spent; otherwise the inner matcher's rows."""
        if self._thinking and self.spent >= self.budget:
            row = bitmask[index]
            row.zero_()
            bit = self.think_end & 31
            row[self.think_end >> 5] |= (1 << bit) if bit < 31 else -(1 << 31)
            return True
        return False if self.inner is None else bool(self.inner.fill_bitmask(bitmask, index))

    def is_terminated(self) -> bool:
        return False if self.inner is None else bool(self.inner.is_terminated())

    @property
    def dead_end(self) -> Any:
        """The inner matcher's dead end (:attr:`~sparkfold.glm.grammar.ConstrainedMatcher.dead_end`)."""
        return None if self.inner is None else self.inner.dead_end

    def rollback(self, count: int) -> None:
        count = min(count, len(self._history))
        if count > 0:
            del self._history[-count:]
            self._thinking = not self.think_end_seen()
        if self.inner is not None:
            self.inner.rollback(count)

    def think_end_seen(self) -> bool:
        """Whether a kept token closed the reasoning (a reasoning token is followed by a non-one)."""
        return bool(self._history) and not self._history[-1]

    def reset(self) -> None:
        self._history.clear()
        self._thinking = True
        if self.inner is not None:
            self.inner.reset()
