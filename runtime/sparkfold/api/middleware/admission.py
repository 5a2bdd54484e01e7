"""Admission: generating requests take a lane (see :mod:`sparkfold.api.lanes`) before they run.

The body is read first (so a refusal leaves the connection usable), then the request enters the
lanes. While it waits in the queue the client's connection is watched: a client that leaves is
dropped at once and frees its place. The lane is held until the response is finished or the
client is gone, then handed to the next waiter.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from sparkfold.api.errors import Overloaded, error_response
from sparkfold.api.lanes import Lanes
from sparkfold.api.metrics import Metrics
from sparkfold.api.middleware._body import ClientGone, read_body, replay


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
        try:
            body = await read_body(receive)
        except ClientGone:
            return
        try:
            admitted = await _enter_unless_gone(self.lanes, receive)
        except Overloaded as error:
            self.metrics.rejected.inc()
            await error_response(error, scope["path"])(scope, receive, send)
            return
        if not admitted:
            self.metrics.dropped.inc()
            return
        try:
            await self.app(scope, replay(body, receive), send)
        finally:
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
