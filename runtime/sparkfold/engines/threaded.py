"""The half our two engines share: a Hugging Face tokenizer and one engine thread fed by an inbox.

:class:`ThreadedEngine` implements the tokenizer side of the :class:`~sparkfold.engines.generator.Generator`
seam and its request plumbing: ``generate`` puts a job on the inbox and streams the token ids the
engine thread emits back to the event loop. A subclass builds its model, calls :meth:`_start`, and
writes the thread's loop, ``_run``, which takes jobs (``None`` means stop) from ``self._inbox``.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sparkfold.engines.generator import Emit, EngineFailure, SamplingParams, stream_from_thread

__all__ = ["Job", "ThreadedEngine"]

SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "pad_token", "unk_token")


@dataclass(eq=False)
class Job:
    """One request as the engine thread sees it; engines add their own bookkeeping fields."""

    prompt: list[int]
    params: SamplingParams
    cancel: threading.Event
    emit: Emit


J = TypeVar("J", bound=Job)


class ThreadedEngine(Generic[J]):
    """Tokenizer methods, health, ``generate`` and ``close`` over one engine thread."""

    job_type: type[J]
    _fatal: str | None = None

    def _start(self, tokenizer: Any) -> None:
        """Adopt the tokenizer and start the engine thread (call last in ``__init__``)."""
        self._tokenizer = tokenizer
        self.chat_template: str | None = getattr(tokenizer, "chat_template", None)
        self.special_tokens = {
            name: value
            for name in SPECIAL_TOKEN_NAMES
            if isinstance(value := getattr(tokenizer, name, None), str)
        }
        self._inbox: queue.Queue[J | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        raise NotImplementedError

    # --- tokenizer ------------------------------------------------------------------------------

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tokenizer.decode(list(ids), skip_special_tokens=False))

    def token_strs(self, ids: Sequence[int]) -> list[str]:
        return list(self._tokenizer.convert_ids_to_tokens(list(ids)))

    # --- generation -----------------------------------------------------------------------------

    def healthy(self) -> bool:
        return self._fatal is None and self._thread.is_alive()

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, cancel: threading.Event
    ) -> AsyncIterator[int]:
        if self._fatal is not None:
            raise EngineFailure(self._fatal)

        def submit(emit: Emit) -> None:
            self._inbox.put(self.job_type(list(prompt_ids), params, cancel, emit))

        async for token in stream_from_thread(submit, cancel):
            yield token

    def close(self) -> None:
        """Stop the engine thread; the thread's loop ends what still runs."""
        self._inbox.put(None)
        self._thread.join(timeout=30)
