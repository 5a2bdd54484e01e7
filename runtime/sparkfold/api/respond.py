"""Turning a serving result into HTTP: the one mapping every router uses.

``dict`` -> JSON 200; :class:`~sparkfold.api.errors.ApiError` -> its status and JSON error in
the route's dialect; :class:`~sparkfold.asgi.EventStream` -> ``text/event-stream``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from starlette.responses import JSONResponse, Response

from sparkfold.api.errors import ApiError, error_response
from sparkfold.asgi import SSE_HEADERS, EventStream, SSEResponse, StreamResponse

__all__ = ["respond"]


def respond(
    result: dict[str, Any] | ApiError | EventStream, path: str, headers: Mapping[str, str] | None = None
) -> Response:
    """``result`` as a response, with ``headers`` (a call's :attr:`CallContext.headers`) added."""
    if isinstance(result, ApiError):
        response = error_response(result, path)
        response.headers.update(headers or {})
        return response
    if isinstance(result, EventStream):
        if not headers:
            return StreamResponse(result)
        extra = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        return StreamResponse(SSEResponse(result, headers=[*SSE_HEADERS, *extra]))
    return JSONResponse(result, headers=dict(headers or {}))
