"""Count every answered request by route and status, time it, and log one structured line."""

from __future__ import annotations

import logging
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sparkfold.api.metrics import Metrics, route_label
from sparkfold.api.middleware.base import HttpMiddleware

log = logging.getLogger("sparkfold.api.access")


class Observe(HttpMiddleware):
    def __init__(self, app: ASGIApp, *, metrics: Metrics) -> None:
        super().__init__(app)
        self.metrics = metrics

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        status = 0
        started = time.perf_counter()

        async def _send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, _send)
        finally:
            route = route_label(scope["path"])
            elapsed = time.perf_counter() - started
            # status 0: the client left before any answer (dropped from the queue, or cancelled)
            self.metrics.count_request(route, status, elapsed)
            log.info(
                "request",
                extra={
                    "request_id": scope.get("state", {}).get("request_id"),
                    "method": scope["method"],
                    "path": scope["path"],
                    "status": status,
                    "seconds": round(elapsed, 4),
                },
            )
