"""Admission: ``parallel`` lanes to the engine and a bounded queue in front of them.

:meth:`Lanes.enter` returns at once with a lane when one is free, waits in FIFO order while the
queue has room, and raises :class:`~sparkfold.api.errors.Overloaded` (429) when it has none.
A waiter that is cancelled (its client left) leaves the queue at once. :meth:`Lanes.leave`
hands the lane straight to the oldest waiter, so a freed lane is never raced for.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from sparkfold.api.errors import EngineAtCapacity, Overloaded

__all__ = ["CAPACITY_PATIENCE_S", "TOKENIZER_LANES", "TOKENIZER_QUEUE", "LaneState", "Lanes", "at_the_head"]

log = logging.getLogger(__name__)

T = TypeVar("T")

CAPACITY_PATIENCE_S = 10.0
"""How long a request the engine refused for want of a lane keeps asking before it fails."""

TOKENIZER_LANES, TOKENIZER_QUEUE = 2, 16
"""The tokenizer routes' own lanes and queue (``/tokenize``, ``/detokenize``, Anthropic
``count_tokens``). Their own, not the generating lanes: a count must not wait minutes behind long
generations, nor take a lane from one. Two: the engine does this work in the one prompt thread it
shares with generating requests, so a flood of counts queues here (429 past the queue), never
there ahead of a generation's prompt."""


@dataclass(frozen=True)
class LaneState:
    total: int
    busy: int
    queued: int
    max_queued: int

    @property
    def free(self) -> int:
        return self.total - self.busy


class Lanes:
    """``parallel`` lanes and up to ``max_queued`` waiters; ``knobs`` names them in the 429."""

    def __init__(
        self, parallel: int, max_queued: int, *, knobs: str = "api.parallel, api.max_queued"
    ) -> None:
        if parallel < 1:
            raise ValueError("parallel must be at least 1")
        if max_queued < 0:
            raise ValueError("max_queued must not be negative")
        self.parallel = parallel
        self.max_queued = max_queued
        self.knobs = knobs
        self._busy = 0
        self._waiters: tuple[deque[asyncio.Future[None]], ...] = (deque(), deque())
        """One FIFO per priority (0 first)."""

    def __repr__(self) -> str:
        return f"Lanes(parallel={self.parallel}, max_queued={self.max_queued}, busy={self._busy})"

    @property
    def state(self) -> LaneState:
        return LaneState(self.parallel, self._busy, self._queued, self.max_queued)

    @property
    def _queued(self) -> int:
        return sum(len(waiters) for waiters in self._waiters)

    def try_enter(self) -> bool:
        """Take a free lane now if nobody is waiting for one; False if the caller must queue."""
        if self._busy < self.parallel and not self._queued:
            self._busy += 1
            return True
        return False

    async def enter(self, priority: int = 0) -> None:
        """Take a lane, waiting in the queue if needed; raise Overloaded if the queue is full."""
        if self.try_enter():
            return
        if self._queued >= self.max_queued:
            raise Overloaded(
                f"all {self.parallel} lanes are busy and {self.max_queued} requests are queued "
                f"({self.knobs}); retry later"
            )
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self._waiters[min(max(priority, 0), len(self._waiters) - 1)]
        queue.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.leave()  # the lane was handed over just as we were cancelled: pass it on
            elif waiter in queue:
                queue.remove(waiter)
            raise

    def leave(self) -> None:
        """Give a lane back, to the oldest waiter of the first priority that has one."""
        for queue in self._waiters:
            while queue:
                waiter = queue.popleft()
                if not waiter.done():
                    waiter.set_result(None)
                    return
        self._busy -= 1


async def at_the_head(attempt: Callable[[], Awaitable[T]], patience_s: float = CAPACITY_PATIENCE_S) -> T:
    """``attempt()``, asked again while the engine refuses it for want of a lane (its 503
    ``capacity``, or the 429 of an engine with a queue of its own that is full).

    The request keeps the lane the gateway gave it, so it stays at the head of the queue: the
    engine is only behind (a job whose client just left is not reaped yet), and nobody behind
    it could be served sooner. The engine gives no signal when it catches up, so the request
    asks again after a short, doubling pause, for at most ``patience_s``; then the refusal stands.
    """
    loop = asyncio.get_running_loop()
    give_up = loop.time() + patience_s
    pause = 0.01
    while True:
        try:
            return await attempt()
        except (EngineAtCapacity, Overloaded):  # from the engine: ``attempt`` never queues here
            if loop.time() + pause > give_up:
                raise
            log.info("the engine is behind the gateway's lanes; asking again in %.2f s", pause)
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.5)
