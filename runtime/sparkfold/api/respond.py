"""Turning a serving result into HTTP: the one mapping every router uses.

``dict`` -> JSON 200; :class:`~sparkfold.api.errors.ApiError` -> its status and JSON error in
the route's dialect; :class:`~sparkfold.asgi.EventStream` -> ``text/event-stream``.
"""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse, Response

from sparkfold.api.errors import ApiError, error_response
from sparkfold.asgi import EventStream, StreamResponse

__all__ = ["respond"]


def respond(result: dict[str, Any] | ApiError | EventStream, path: str) -> Response:
    if isinstance(result, ApiError):
        return error_response(result, path)
    if isinstance(result, EventStream):
        return StreamResponse(result)
    return JSONResponse(result)
