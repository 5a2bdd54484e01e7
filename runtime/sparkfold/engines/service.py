"""Serving logic of our engine servers: requests in, text pieces and outcomes out.

:class:`EngineService` puts together the parts of an engine server, each in a module of its own,
and runs the generator: it turns token ids into text (stop strings, incremental decoding) and
keeps the counters. Client mistakes come back as :class:`~sparkfold.engines.error_reply.ErrorReply`
values; ``server.py`` maps them to HTTP.

- :class:`~sparkfold.engines.preparing.RequestPreparer` (``requests``): a request checked against
  the engine (window, capacity, unsupported fields), rendered and tokenized, one
  :class:`~sparkfold.engines.preparing.Prepared` reply per choice;
- :class:`~sparkfold.engines.prompt_workers.PromptWorkers` (``workers``): that preparing, in
  worker threads, never on the event loop nor on the engine thread;
- :class:`~sparkfold.engines.capacity.Capacity` (``capacity``): the lanes, a request's wait for
  one, and the lane a request keeps between its choices;
- :class:`~sparkfold.engines.metrics.EngineCounters` (``counters``): ``/health`` totals and
  ``/metrics``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Sequence
from typing import Any

from sparkfold.engines.capacity import Capacity
from sparkfold.engines.generator import Generator
from sparkfold.engines.metrics import EngineCounters
from sparkfold.engines.outcome import Outcome
from sparkfold.engines.output import TextStream
from sparkfold.engines.preparing import Prepared, RequestPreparer
from sparkfold.engines.prompt_workers import PromptWorkers
from sparkfold.protocol import EngineCapabilities, EngineHealth, PeerState

__all__ = ["EngineService"]


class EngineService:
    """The engine protocol's logic over one :class:`Generator`.

    ``peer_state`` (from the node supervisor) fills ``/health``'s peer block; every other keyword
    (``served_name``, ``max_tokens``, ``seed``, ``thinking``, ``renderer`` …) is
    :class:`~sparkfold.engines.preparing.RequestPreparer`'s.
    """

    def __init__(
        self,
        generator: Generator,
        *,
        peer_state: Callable[[], PeerState | None] | None = None,
        **preparing: Any,
    ) -> None:
        self.generator = generator
        self.peer_state = peer_state or (lambda: None)
        self.requests = RequestPreparer(generator, **preparing)
        self.served_name = self.requests.served_name
        self.workers = PromptWorkers()
        self.counters = EngineCounters()
        self.capacity = Capacity(generator.parallel, lambda: self.counters.requests_running)
        self.ready = True
        """False until the supervisor's start-up probe answered: ``/health`` says ``ok`` only then."""

    # --- generation -----------------------------------------------------------------------------

    async def run_choices(self, choices: Sequence[Prepared]) -> AsyncIterator[tuple[int, str | Outcome]]:
        """Each choice's pieces and outcome (with its index), the choices one after another.

        The request keeps its one lane from the first choice to the last: between two choices the
        lane is held (no other request is let in), and the next choice takes it back before any
        await, so a request with ``n`` choices never needs a second lane nor meets a capacity
        refusal half-way.
        """
        held = False
        last = len(choices) - 1
        try:
            for index, prepared in enumerate(choices):
                if held:  # run() counts itself as running before its first await
                    self.capacity.unhold()
                    held = False
                async for item in self.run(prepared, release=index == last):
                    if isinstance(item, Outcome) and index < last:
                        self.capacity.hold()
                        held = True
                    yield index, item
        finally:
            if held:
                self.capacity.unhold()
            self.capacity.lane_freed()

    async def run(self, prepared: Prepared, *, release: bool = True) -> AsyncIterator[str | Outcome]:
        """Text pieces as they become final, then one :class:`Outcome`.

        Leaving the iteration early (client gone) cancels the generation. ``release=False`` (a
        request with more choices to run) does not wake the requests waiting for a lane.
        """
        counters, generator = self.counters, self.generator
        cancel = threading.Event()
        text = TextStream(generator.decode, prepared.stop)
        ids: list[int] = []
        finish = "length"
        started = time.monotonic()
        first = started
        counters.started(len(prepared.prompt_ids))
        tokens = generator.generate(prepared.prompt_ids, prepared.params, cancel)
        try:
            async for token in tokens:
                if not ids:
                    first = time.monotonic()
                ids.append(token)
                counters.token()
                ended = token in generator.eos_token_ids and not prepared.params.ignore_eos
                if ended or token in prepared.params.stop_token_ids:
                    finish = "stop"
                    break
                piece = text.push(token)
                if piece:
                    yield piece
                if text.stopped or prepared.parser.ended:  # the parser may end a reply (a repeated call)
                    finish = "stop"
                    break
            tail = text.flush()
            if tail:
                yield tail
        except (GeneratorExit, asyncio.CancelledError):
            finish = "abort"  # the client left
            raise
        except Exception:
            finish = "error"
            raise
        finally:
            cancel.set()
            if isinstance(tokens, AsyncGenerator):  # the protocol promises only an AsyncIterator
                await tokens.aclose()
            now = time.monotonic()
            counters.finished(finish, first - started, now - first if ids else 0.0)
            if release:
                self.capacity.lane_freed()
        report = prepared.params.report
        counters.reported(report.cached_tokens, report.drafted, report.accepted)
        end = prepared.reasoning_end
        reasoning = 0 if end is None else (ids.index(end) if end in ids else len(ids))
        yield Outcome(
            finish,
            len(prepared.prompt_ids),
            ids,
            first - started,
            now - first,
            report,
            text.matched,
            reasoning,
        )

    # --- status ---------------------------------------------------------------------------------

    def capabilities(self) -> EngineCapabilities:
        """What ``/v1/models`` tells the gateway this engine can do."""
        return EngineCapabilities(backend=self.generator.backend, logprobs=self.generator.supports_logprobs)

    def health(self) -> EngineHealth:
        peer = self.peer_state()
        return EngineHealth.model_validate(
            {
                "ok": self.ready and self.generator.healthy() and (peer is None or peer.state != "lost"),
                "backend": self.generator.backend,
                "busy": self.counters.requests_running > 0,
                **self.counters.totals(),
                "context_length": self.generator.context_length,
                "streams": self.generator.parallel,
                "peer": peer,
                "pool": self.generator.pool_stats(),
                "stalled_s": round(stall, 3) if (stall := self.generator.stalled_s()) is not None else None,
            }
        )
