"""Give every request an id (the client's ``x-request-id`` if sane) and echo it in the response."""

from __future__ import annotations

import re
import time
import uuid

from starlette.datastructures import MutableHeaders
from starlette.types import Message, Receive, Scope, Send

from sparkfold.api.middleware.base import HttpMiddleware

HEADER = "x-request-id"
_SANE = re.compile(r"[A-Za-z0-9._:-]{1,128}")


class RequestId(HttpMiddleware):
    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        offered = ""
        for name, value in scope["headers"]:
            if name == HEADER.encode():
                offered = value.decode("latin-1")
        request_id = offered if _SANE.fullmatch(offered) else uuid.uuid4().hex
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        state["started"] = time.perf_counter()

        async def _send(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)[HEADER] = request_id
            await send(message)

        await self.app(scope, receive, _send)
