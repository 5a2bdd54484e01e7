"""The seam between the HTTP server and an engine implementation.

An engine implementation (transformers on CPU now, exllamav3 later) is a :class:`Generator`: it
tokenizes, and it turns prompt token ids into reply token ids, one at a time, until the reply
budget is spent, an end-of-sequence token comes, or the request is cancelled. Everything else
(chat templates, stop strings, SSE, errors, counters) is the server's job.
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = ["CapacityError", "EngineFailure", "Generator", "SamplingParams"]


class CapacityError(RuntimeError):
    """The engine runs as many requests as it may (HTTP 503)."""


class EngineFailure(RuntimeError):
    """The engine can no longer generate (a peer rank is gone, a collective failed)."""


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token. ``temperature == 0`` is greedy (argmax)."""

    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int = 0
    ignore_eos: bool = False
    stop_token_ids: frozenset[int] = field(default_factory=frozenset)
    constraint: Any = field(default=None, compare=False)
    """Per-request token matcher (``sparkfold.glm.grammar.ConstrainedMatcher``): masks the logits."""
    prefill_inputs: Mapping[str, Any] | None = field(default=None, compare=False)
    """Extra model inputs of the prompt's forward (``pixel_values``, ``image_grid_thw`` …)."""

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


@runtime_checkable
class Generator(Protocol):
    """What an engine implementation offers the server."""

    backend: str
    """Name reported in ``/health`` (``backend``)."""
    context_length: int
    """The window: prompt + reply tokens per request."""
    parallel: int
    """Requests it runs at once; the server answers 503 past that."""
    eos_token_ids: frozenset[int]
    vocab_size: int
    """Token ids run from 0 to ``vocab_size - 1``."""
    chat_template: str | None
    special_tokens: dict[str, str]
    """``bos_token``, ``eos_token`` … as the chat template expects them."""

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def token_strs(self, ids: Sequence[int]) -> list[str]: ...

    def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, cancel: threading.Event
    ) -> AsyncIterator[int]:
        """Reply token ids in order; stops early when ``cancel`` is set. Raises :class:`EngineFailure`."""
        ...

    def healthy(self) -> bool: ...

    def close(self) -> None: ...
