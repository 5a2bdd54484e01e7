"""Turning a serving result into HTTP: the one mapping every router uses.

``dict`` -> JSON 200; :class:`~sparkfold.api.errors.ApiError` -> its status and JSON error in
the route's dialect; :class:`~sparkfold.api.streaming.EventStream` -> ``text/event-stream``.
"""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from sparkfold.api.errors import ApiError, error_response
from sparkfold.api.streaming import EventStream, SSEResponse

__all__ = ["StreamResponse", "respond"]


class StreamResponse(Response):
    """A starlette Response wrapper around :class:`SSEResponse` (so frameworks pass it through)."""

    media_type = "text/event-stream"

    def __init__(self, stream: EventStream) -> None:
        super().__init__(status_code=200)
        self._sse = SSEResponse(stream)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._sse(scope, receive, send)


def respond(result: dict[str, Any] | ApiError | EventStream, path: str) -> Response:
    if isinstance(result, ApiError):
        return error_response(result, path)
    if isinstance(result, EventStream):
        return StreamResponse(result)
    return JSONResponse(result)
