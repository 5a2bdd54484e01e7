"""Admission: generating requests take a lane (see :mod:`sparkfold.api.lanes`) before they run.

The lane is taken late: this middleware puts an ``admit`` function in the request's state, and
the serving code calls it (through :class:`~sparkfold.api.context.CallContext`) once the request
has been read, validated and checked against the limits, just before the engine is asked. So a
malformed or oversized request gets its 4xx even when every lane is busy, and never holds a
queue place. A client that leaves while its request waits (or runs) cancels the handler
(:func:`sparkfold.asgi.unless_disconnected`, around every generating route): a waiter leaves
the queue at once. The lane is held until the response is finished or the client is gone, then
handed to the next waiter.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from sparkfold.api.errors import Overloaded
from sparkfold.api.lanes import Lanes
from sparkfold.api.metrics import Metrics


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

        async def admit(priority: int = 0) -> Overloaded | None:
            """Take a lane (priority 1 queues behind 0): None once taken, Overloaded past the queue."""
            nonlocal held
            if held:
                return None
            try:
                await self.lanes.enter(priority=priority)
            except Overloaded as error:
                self.metrics.rejected.inc()
                return error
            except asyncio.CancelledError:
                self.metrics.dropped.inc()  # the client left while queued
                raise
            held = True
            return None

        scope.setdefault("state", {})["admit"] = admit
        try:
            await self.app(scope, receive, send)
        finally:
            if held:
                self.lanes.leave()
