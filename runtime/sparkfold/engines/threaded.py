"""The half our two engines share: a Hugging Face tokenizer and one engine thread that schedules.

:class:`ThreadedEngine` implements the tokenizer side of the :class:`~sparkfold.engines.generator.Generator`
seam, its request plumbing and the engine thread's scheduling loop: ``generate`` puts a job on the
inbox and streams the token ids the engine thread emits back to the event loop (all of a step's
tokens in one hand-over, :class:`~sparkfold.engines.generator.Outbox`); the thread admits
jobs up to ``parallel``, ends the ones whose client left, and steps the model. A subclass builds
its model, calls :meth:`_start`, and writes what is its own:

``_begin(job)``   put an admitted job on the model (``None``), or the error that refuses it alone
``_step()``       one step of every running job; a finished job ends with :meth:`_end`
``_release(job)`` free what a job held on the model (it ended, failed or was cancelled)
``_cancel(job)``  tell the model a job was abandoned (before ``_release``)
``_idle()``       nothing ran for ``idle_wait_s``
``_after_step()`` after each turn of the loop (snapshots)
``_shutdown()``   the loop ended on request (not on a failure)

Admission order: jobs whose client left are reaped *before* new ones are admitted, so a lane the
gateway handed on (its client left, the next request came at once) is always free here.

Liveness comes from progress: :meth:`ThreadedEngine.stalled_s` is how long work has been pending
without a step completing; ``healthy()`` turns false past ``stall_s`` (``/health`` then says 503
and the supervisor stops feeding the systemd watchdog), even though the thread is still alive.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from sparkfold.engines.generator import (
    CapacityError,
    Emit,
    EngineFailure,
    Generator,
    Outbox,
    SamplingParams,
    stream_from_thread,
)

__all__ = ["HfTokenizer", "Job", "ThreadedEngine"]

log = logging.getLogger(__name__)

SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "pad_token", "unk_token")
GATHER_SPAN = 8
"""A burst is gathered for at most ``GATHER_SPAN`` × ``gather_s`` in all."""


@dataclass(eq=False)
class Job:
    """One request as the engine thread sees it; engines add their own bookkeeping fields."""

    prompt: list[int]
    params: SamplingParams
    cancel: threading.Event
    emit: Emit


J = TypeVar("J", bound=Job)


class EngineBroken(Exception):
    """Raised by a backend when the engine, not one request, cannot go on (e.g. tp=2 ranks out of step)."""


class HfTokenizer(Generator):
    """The tokenizer side of the Generator seam over a Hugging Face tokenizer."""

    def _adopt(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self.chat_template: str | None = getattr(tokenizer, "chat_template", None)
        self.special_tokens = {
            name: value
            for name in SPECIAL_TOKEN_NAMES
            if isinstance(value := getattr(tokenizer, name, None), str)
        }

    @property
    def tokenizer(self) -> Any:
        """The Hugging Face tokenizer (structured outputs compile their grammar for it)."""
        return self._tokenizer

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tokenizer.decode(list(ids), skip_special_tokens=False))

    def token_strs(self, ids: Sequence[int]) -> list[str]:
        return list(self._tokenizer.convert_ids_to_tokens(list(ids)))


class ThreadedEngine(HfTokenizer, Generic[J]):
    """Tokenizer methods, health, ``generate``, ``close`` and the scheduling loop over one engine thread."""

    job_type: type[J]
    parallel: int
    idle_wait_s = 0.5
    """How long an idle engine thread waits for a job before it calls :meth:`_idle`."""
    gather_s = 0.0
    """An idle engine that just got a job keeps admitting until none came for this long (0: off)."""
    _fatal: str | None = None
    _on_fatal: Callable[[str], None] | None = None

    def _start(self, tokenizer: Any) -> None:
        """Adopt the tokenizer and start the engine thread (call last in ``__init__``)."""
        self._adopt(tokenizer)
        self._inbox: queue.Queue[J | None] = queue.Queue()
        self._outbox = Outbox()
        """What a step emits reaches each event loop in one call (not one per token)."""
        self._active: dict[J, None] = {}
        """Running jobs in admission order (only the engine thread touches it)."""
        self._progress_at = time.monotonic()
        """When the engine thread last completed a step or found nothing to do."""
        self.steps_total = 0
        self._thread = threading.Thread(target=self._run, name="engine", daemon=True)
        self._thread.start()

    # --- what a subclass writes -----------------------------------------------------------------

    def _begin(self, job: J) -> BaseException | None:
        raise NotImplementedError

    def _step(self) -> None:
        raise NotImplementedError

    def _release(self, job: J) -> None:
        return None

    def _cancel(self, job: J) -> None:
        return None

    def _idle(self) -> None:
        return None

    def _after_step(self) -> None:
        return None

    def _shutdown(self) -> None:
        return None

    # --- generation -----------------------------------------------------------------------------

    def healthy(self) -> bool:
        return self._fatal is None and self._thread.is_alive() and self.stalled_s() < self.stall_s

    def stalled_s(self) -> float:
        """Seconds work has waited without a step completing (0 while idle or progressing)."""
        if not self._active and self._inbox.empty():
            return 0.0
        return max(time.monotonic() - self._progress_at, 0.0)

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, cancel: threading.Event
    ) -> AsyncIterator[int]:
        if self._fatal is not None:
            raise EngineFailure(self._fatal)

        def submit(emit: Emit) -> None:
            self.submit(prompt_ids, params, cancel, emit)

        async for token in stream_from_thread(submit, cancel, self._outbox):
            yield token

    def submit(
        self, prompt_ids: Sequence[int], params: SamplingParams, cancel: threading.Event, emit: Emit
    ) -> None:
        """Queue a request whose output the engine thread hands to ``emit`` (``generate`` without a loop)."""
        self._inbox.put(self.job_type(list(prompt_ids), params, cancel, emit))

    def use_outbox(self, outbox: Outbox) -> None:
        """Hand each step's output to ``outbox`` (an engine core's step message) from now on."""
        self._outbox = outbox

    def close(self) -> None:
        """Stop the engine thread; the thread's loop ends what still runs."""
        self._inbox.put(None)
        self._thread.join(timeout=30)

    # --- the engine thread ----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                if not self._active:
                    self._progress_at = time.monotonic()  # idle is not stalled
                    try:
                        first = self._inbox.get(timeout=self.idle_wait_s)
                    except queue.Empty:
                        self._idle()
                        continue
                    if first is None or not self._admit(first) or not self._gather():
                        break
                self._reap()  # before admitting: a lane whose client left is free for the next
                if not self._drain_inbox():
                    break
                if self._active:
                    with self._outbox.step():
                        self._step()
                    self.steps_total += 1
                self._progress_at = time.monotonic()
                self._after_step()
            for job in list(self._active):
                self._end(job, None)
            self._shutdown()
        except Exception as exc:
            log.exception("engine stopped")
            self._fail(f"engine stopped: {exc}")

    def _gather(self) -> bool:
        """Admit the rest of a burst before the first step; ``False`` when asked to stop.

        A batching engine prefills the prompts that wait at its first step together; one that
        arrives a moment later is prefilled a step later. So an idle engine that just got a
        request keeps taking requests until none came for ``gather_s``.
        """
        if self.gather_s <= 0:
            return True
        deadline = time.monotonic() + GATHER_SPAN * self.gather_s
        while len(self._active) < self.parallel:
            wait = min(self.gather_s, deadline - time.monotonic())
            if wait <= 0:
                return True
            try:
                job = self._inbox.get(timeout=wait)
            except queue.Empty:
                return True
            if not self._admit(job):
                return False
        return True

    def _drain_inbox(self) -> bool:
        """Admit what waits; ``False`` when asked to stop."""
        while True:
            try:
                job = self._inbox.get_nowait()
            except queue.Empty:
                return True
            if not self._admit(job):
                return False

    def _admit(self, job: J | None) -> bool:
        """Start ``job`` (or refuse it alone); ``False`` when it is the stop sentinel."""
        if job is None:
            return False
        if len(self._active) >= self.parallel:
            self._reap()
        if len(self._active) >= self.parallel:
            job.emit(CapacityError(f"the engine runs {self.parallel} requests already"))
            return True
        try:
            refused = self._begin(job)
        except EngineBroken:
            raise  # the engine itself cannot go on: the loop stops and the supervisor exits
        except Exception as exc:  # a backend bug on one request's input: that request fails, not the engine
            log.exception("a request could not be started")
            refused = EngineFailure(f"the request could not be started: {exc}")
        if refused is not None:
            job.emit(refused)
            return True
        self._active[job] = None
        return True

    def _reap(self) -> None:
        """End the running jobs whose client left."""
        for job in list(self._active):
            if job.cancel.is_set():
                self._cancel(job)
                self._end(job, None)

    def _end(self, job: J, error: BaseException | None) -> None:
        """``job`` is over: release it and tell its caller (``None``: done)."""
        if job in self._active:
            del self._active[job]
            self._release(job)
        job.emit(error)

    def _fail(self, message: str) -> None:
        """The engine cannot go on: fail every running and queued job, then tell the supervisor."""
        self._fatal = message
        for job in list(self._active):
            self._active.pop(job, None)
            job.emit(EngineFailure(message))
        while True:
            try:
                queued = self._inbox.get_nowait()
            except queue.Empty:
                break
            if queued is not None:
                queued.emit(EngineFailure(message))
        if self._on_fatal is not None:
            self._on_fatal(message)
