"""The seam between the HTTP server and an engine implementation.

An engine implementation (transformers, exllamav3, an engine core's client) is a :class:`Generator`: it
tokenizes, and it turns prompt token ids into reply token ids, one at a time, until the reply
budget is spent, an end-of-sequence token comes, or the request is cancelled. Everything else
(chat templates, stop strings, SSE, errors, counters) is the server's job.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from sparkfold.config import STALL_S

if TYPE_CHECKING:
    from sparkfold.glm.chat import GlmChat

__all__ = [
    "CapacityError",
    "Emit",
    "EngineFailure",
    "EngineGone",
    "GenerationReport",
    "Generator",
    "Outbox",
    "SamplingParams",
    "TokenLogprob",
    "stream_from_thread",
]

Emit = Callable[[int | BaseException | None], None]
"""How an engine thread hands one request's output to its caller: a token id, an error, or ``None`` (done)."""


class CapacityError(RuntimeError):
    """The engine runs as many requests as it may (HTTP 503)."""


class EngineFailure(RuntimeError):
    """The engine can no longer generate (a peer rank is gone, a collective failed)."""


class EngineGone(EngineFailure):
    """The engine's own process is gone (an engine core killed or crashed): HTTP 503 ``engine_unavailable``.

    Unavailable rather than a server bug: clients and the gateway retry a 503, and systemd restarts
    the rank once its watchdog goes unfed (``/health`` is 503 meanwhile).
    """


@dataclass
class GenerationReport:
    """What an engine tells the server about one finished request (filled while it runs)."""

    cached_tokens: int = 0
    """Prompt tokens reused from the engine's prompt cache instead of prefilled."""
    drafted: int = 0
    accepted: int = 0
    prepare_s: float = 0.0
    """The engine server's time to parse, render and tokenize the request (before a lane)."""
    phases_s: dict[str, float] = field(default_factory=dict)
    """The engine's own per-phase seconds, where it says them (exllamav3: ``queued`` = enqueue
    to the first prefill chunk, page matching and recurrent-state restore included; ``prefill``
    = first chunk to first token; ``generate``)."""


@dataclass(frozen=True)
class TokenLogprob:
    """One reply token's log-probability under the model, and the likeliest alternatives."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


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
    draft: bool = True
    """``False``: decode without speculative drafts (the plain reference output)."""
    report: GenerationReport = field(default_factory=GenerationReport, compare=False)
    """Filled by engines that know more than the token stream (cached prompt tokens, drafts)."""
    logprobs: int | None = None
    """``None``: none; ``k``: each reply token's log-probability and the ``k`` likeliest (engines
    with ``supports_logprobs``)."""
    logprobs_out: list[TokenLogprob] = field(default_factory=list, compare=False)
    """Filled by the engine, one entry per reply token, before the token is emitted."""

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


class Generator:
    """What an engine implementation offers the server; every engine subclasses it.

    The first block is what each engine must give (values set by its constructor, methods it
    writes). The second is every capability the server reads beyond that, each with the default
    of an engine that lacks it, so the server asks the engine, never ``getattr``.
    """

    backend: str
    """Name reported in ``/health`` (``backend``)."""
    context_length: int
    """The window: prompt + reply tokens per request."""
    parallel: int
    """Requests it runs at once; the server answers 503 past that."""
    eos_token_ids: frozenset[int]
    vocab_size: int
    """Token ids run from 0 to ``vocab_size - 1``."""
    chat_template: str | None = None
    special_tokens: dict[str, str]
    """``bos_token``, ``eos_token`` … as the chat template expects them."""

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: Sequence[int]) -> str:
        raise NotImplementedError

    def token_strs(self, ids: Sequence[int]) -> list[str]:
        raise NotImplementedError

    def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, cancel: threading.Event
    ) -> AsyncIterator[int]:
        """Reply token ids in order; stops early when ``cancel`` is set. Raises :class:`EngineFailure`."""
        raise NotImplementedError

    # --- capabilities, with the default of an engine that lacks them ----------------------------

    tp: int = 1
    """Ranks (or GPUs) the model is split over; pictures need 1."""
    supports_logprobs: bool = False
    """Whether it fills ``SamplingParams.logprobs_out``."""
    glm: GlmChat | None = None
    """GLM's protocol (prompts, parsers, grammar, pictures) for a GLM checkpoint."""
    stall_s: float = STALL_S["ours"]
    """Work pending this long without progress: the engine is wedged and ``healthy()`` false (an
    engine that measures progress, :meth:`stalled_s`). Its server sets it from ``[engine] stall_s``."""
    start_phases: Mapping[str, float] = MappingProxyType({})
    """Seconds the engine's start took, by phase (``load_s``, ``warmup_s``), set by its loader."""

    @property
    def tokenizer(self) -> Any:
        """The Hugging Face tokenizer, for grammars of chat-template models (``None``: none)."""
        return None

    def healthy(self) -> bool:
        return True

    def stalled_s(self) -> float | None:
        """Seconds work has waited without progress (``None``: the engine does not measure it)."""
        return None

    def pool_stats(self) -> dict[str, int] | None:
        """The KV pool's counters for ``/health`` (``None``: no pool to report)."""
        return None

    def metrics_text(self) -> str:
        """The engine's own Prometheus lines, appended to ``/metrics``."""
        return ""

    def close(self) -> None:
        return None


class Outbox:
    """Hands an engine thread's output to the event loops that wait for it.

    Outside :meth:`step` each item goes at once (one ``call_soon_threadsafe``). Inside it, the
    engine thread's items are held and, when the step ends, each event loop gets all of them in
    one call, in the order they were emitted: one wake-up of the HTTP side per step, whatever the
    number of streams, instead of one per token. Every wake-up is a write to the loop's self-pipe,
    and every one lets the event loop take the GIL from the engine thread in the middle of its
    step; batching them is what vLLM's engine core does per step (one output message per step).
    Items another thread emits during a step (none today) still go at once.

    The hold-per-step is this class's one concept; where the held items go is :meth:`flush`'s:
    here the event loops of this process, in an engine core one ``step`` message over the pipe
    (:class:`sparkfold.engines.core.main.StepWriter`).
    """

    def __init__(self) -> None:
        self._held: dict[
            asyncio.AbstractEventLoop, list[tuple[Callable[[Any], None], Any, threading.Event]]
        ] = {}
        self._holder: int | None = None

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """Hold what this thread emits until the block ends (also when it raises), then :meth:`flush`."""
        self._holder = threading.get_ident()
        try:
            yield
        finally:
            self._holder = None
            self.flush()

    def holding(self) -> bool:
        """Whether the calling thread is inside :meth:`step` (what it emits waits for the step's end)."""
        return self._holder == threading.get_ident()

    def flush(self) -> None:
        """Hand over what the step held: each event loop all of its items in one call."""
        held, self._held = self._held, {}
        for loop, calls in held.items():
            _call(loop, _deliver, calls, [cancel for _, _, cancel in calls])

    def send(
        self, loop: asyncio.AbstractEventLoop, put: Callable[[Any], None], item: Any, cancel: threading.Event
    ) -> None:
        """``put(item)`` on ``loop``; ``cancel`` is set when that loop is gone (nobody listens)."""
        if self.holding():
            self._held.setdefault(loop, []).append((put, item, cancel))
        else:
            _call(loop, put, item, [cancel])


def _call(
    loop: asyncio.AbstractEventLoop, fn: Callable[[Any], None], arg: Any, cancels: list[threading.Event]
) -> None:
    try:
        loop.call_soon_threadsafe(fn, arg)
    except RuntimeError:  # the event loop is gone: nobody is listening any more
        for cancel in cancels:
            cancel.set()


def _deliver(calls: list[tuple[Callable[[Any], None], Any, threading.Event]]) -> None:
    for put, item, _ in calls:
        put(item)


async def stream_from_thread(
    submit: Callable[[Emit], None], cancel: threading.Event, outbox: Outbox | None = None
) -> AsyncIterator[int]:
    """Token ids that an engine thread emits through the callback given to ``submit``.

    The callback is safe to call from any thread; once the caller's event loop is gone it sets
    ``cancel``. Leaving the iteration early sets ``cancel`` too, so the engine stops the request.
    With an ``outbox``, what the engine thread emits inside ``outbox.step()`` arrives per step.
    """
    loop = asyncio.get_running_loop()
    items: asyncio.Queue[int | BaseException | None] = asyncio.Queue()
    out = outbox or Outbox()

    def emit(item: int | BaseException | None) -> None:
        out.send(loop, items.put_nowait, item, cancel)

    submit(emit)
    try:
        while True:
            item = await items.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        cancel.set()
