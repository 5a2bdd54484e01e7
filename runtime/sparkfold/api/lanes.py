"""Admission: ``parallel`` lanes to the engine and a bounded queue in front of them.

:meth:`Lanes.enter` returns at once with a lane when one is free, waits in FIFO order while the
queue has room, and raises :class:`~sparkfold.api.errors.Overloaded` (429) when it has none.
A waiter that is cancelled (its client left) leaves the queue at once. :meth:`Lanes.leave`
hands the lane straight to the oldest waiter, so a freed lane is never raced for.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

from sparkfold.api.errors import Overloaded

__all__ = ["LaneState", "Lanes"]


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
    """``parallel`` lanes and up to ``max_queued`` waiters."""

    def __init__(self, parallel: int, max_queued: int) -> None:
        if parallel < 1:
            raise ValueError("parallel must be at least 1")
        if max_queued < 0:
            raise ValueError("max_queued must not be negative")
        self.parallel = parallel
        self.max_queued = max_queued
        self._busy = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    def __repr__(self) -> str:
        return f"Lanes(parallel={self.parallel}, max_queued={self.max_queued}, busy={self._busy})"

    @property
    def state(self) -> LaneState:
        return LaneState(self.parallel, self._busy, len(self._waiters), self.max_queued)

    def try_enter(self) -> bool:
        """Take a free lane now if nobody is waiting for one; False if the caller must queue."""
        if self._busy < self.parallel and not self._waiters:
            self._busy += 1
            return True
        return False

    async def enter(self) -> None:
        """Take a lane, waiting in the queue if needed; raise Overloaded if the queue is full."""
        if self.try_enter():
            return
        if len(self._waiters) >= self.max_queued:
            raise Overloaded(
                f"all {self.parallel} lanes are busy and {self.max_queued} requests are queued "
                "(api.parallel, api.max_queued); retry later"
            )
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():
                self.leave()  # the lane was handed over just as we were cancelled: pass it on
            elif waiter in self._waiters:
                self._waiters.remove(waiter)
            raise

    def leave(self) -> None:
        """Give a lane back, to the oldest waiter if there is one."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._busy -= 1
