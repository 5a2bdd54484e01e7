"""The engine's lanes as the server admits requests to them.

The gateway is the admission authority: a request that finds every lane taken waits briefly for
one (:meth:`Capacity.wait_for_lane`; a job whose client just left is still being released) before
it is refused with 503 ``capacity``, which the gateway retries. A request with several choices
keeps its one lane between them (:meth:`Capacity.hold`), so it never needs a second lane.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from sparkfold.engines.error_reply import ErrorReply

__all__ = ["FOLLOW_S", "Capacity"]

FOLLOW_S = 2.0
"""How long a request that found every lane taken waits for one before the 503 ``capacity``."""


class Capacity:
    """``parallel`` lanes: those of the requests ``running()`` counts plus those held between choices."""

    def __init__(self, parallel: int, running: Callable[[], int]) -> None:
        self.parallel = parallel
        self._running = running
        self.held = 0
        """Lanes kept by a request between two of its choices."""
        self.waiters: list[asyncio.Future[None]] = []
        """The requests waiting for a lane, each woken by :meth:`lane_freed`."""

    def taken(self) -> int:
        return self._running() + self.held

    async def wait_for_lane(self) -> ErrorReply | None:
        """None once a lane is free; the 503 ``capacity`` if none freed within :data:`FOLLOW_S`."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + FOLLOW_S
        while self.taken() >= self.parallel:
            left = give_up - loop.time()
            if left <= 0:
                return ErrorReply(
                    503,
                    f"the engine is at capacity ({self.parallel} requests); retry",
                    None,
                    "capacity",
                    "server_error",
                )
            freed: asyncio.Future[None] = loop.create_future()
            self.waiters.append(freed)
            try:
                await asyncio.wait([freed], timeout=left)
            finally:
                if freed in self.waiters:
                    self.waiters.remove(freed)
        return None

    def hold(self) -> None:
        """Keep a finished choice's lane for the request's next choice (no other request gets it)."""
        self.held += 1

    def unhold(self) -> None:
        """The next choice (or the request's end) takes back the lane :meth:`hold` kept."""
        self.held -= 1

    def lane_freed(self) -> None:
        """Wake every request waiting for a lane (each counts the lanes again)."""
        waiters, self.waiters = self.waiters, []
        for freed in waiters:
            if not freed.done():
                freed.set_result(None)
