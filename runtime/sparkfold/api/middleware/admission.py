"""Admission: generating requests take a lane (see :mod:`sparkfold.api.lanes`) before they run.

The lane is taken late: this middleware puts an ``admit`` function in the request's state, and
the serving code calls it (through :class:`~sparkfold.api.context.CallContext`) once the request
has been read, validated and checked against the limits, just before the engine is asked. So a
malformed or oversized request gets its 4xx even when every lane is busy, and never holds a
queue place. While a request waits in the queue its client's connection is watched: a client
that leaves is dropped at once and frees its place. The lane is held until the response is
finished or the client is gone, then handed to the next waiter.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from sparkfold.api.errors import Overloaded
from sparkfold.api.lanes import Lanes
from sparkfold.api.metrics import Metrics
from sparkfold.api.middleware._body import ClientGone


class Admission:
    def __init__(self, app: ASGIApp, *, lanes: Lanes, paths: Iterable[str], metrics: Metrics) -> None:
        self.app = app
        self.lanes = lanes
        self.paths = frozenset(paths)
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in self.paths:
            await self.app(scope, receive, send)
            return
        held = False

        async def admit() -> Overloaded | None:
            """Take a lane: None once taken, Overloaded past the queue; ClientGone if the client left."""
            nonlocal held
            if held:
                return None
            try:
                held = await _enter_unless_gone(self.lanes, receive)
            except Overloaded as error:
                self.metrics.rejected.inc()
                return error
            if not held:
                self.metrics.dropped.inc()
                raise ClientGone
            return None

        scope.setdefault("state", {})["admit"] = admit
        try:
            await self.app(scope, receive, send)
        except ClientGone:
            pass  # dropped from the queue: nobody is left to answer
        finally:
            if held:
                self.lanes.leave()


async def _enter_unless_gone(lanes: Lanes, receive: Receive) -> bool:
    """Take a lane; False if the client disconnected first (its queue place is given up)."""
    if lanes.try_enter():
        return True
    enter = asyncio.ensure_future(lanes.enter())
    gone = asyncio.ensure_future(_wait_disconnect(receive))
    try:
        await asyncio.wait({enter, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (enter, gone):
            if not task.done():
                task.cancel()
        await asyncio.gather(enter, gone, return_exceptions=True)
    if enter.cancelled():
        return False
    if enter.exception() is None:
        if gone.done() and not gone.cancelled():
            lanes.leave()
            return False
        return True
    raise enter.exception()  # type: ignore[misc]


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    raise ClientGone
