"""Outermost: an unexpected exception becomes a 500 JSON error, never a dropped connection."""

from __future__ import annotations

import logging

from starlette.types import Message, Receive, Scope, Send

from sparkfold.api.errors import ApiError, error_response
from sparkfold.api.middleware.base import HttpMiddleware
from sparkfold.api.middleware.request_id import HEADER

log = logging.getLogger(__name__)


class ServerErrors(HttpMiddleware):
    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = False

        async def _send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, _send)
        except Exception as exc:
            request_id = scope.get("state", {}).get("request_id")
            log.exception("unhandled error", extra={"request_id": request_id, "path": scope["path"]})
            if started:
                return  # the response is under way; the server closes the connection
            error = ApiError(f"internal error (request id {request_id}); the gateway log has the details")
            if isinstance(exc, ApiError):
                error = exc
            response = error_response(error, scope["path"])
            if request_id is not None:  # RequestId sits inside this middleware: its header is missing
                response.headers[HEADER] = request_id
            await response(scope, receive, send)
