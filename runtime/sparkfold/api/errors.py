"""Errors the gateway answers with, and their two wire shapes.

Hierarchy (catch at the level you mean)::

    ApiError                       status, type, message, param, code
    ├── ClientError                4xx: the client can fix it; the message says what to change
    │   ├── InvalidRequest         400 a field is malformed or unsupported (names the field)
    │   ├── LimitExceeded          400/413 a limit was passed (names the field and the limit)
    │   ├── Unauthorized           401 missing or unknown API key
    │   ├── NotFound               404 unknown route, model or stored response
    │   └── Overloaded             429 every lane busy and the queue full (carries Retry-After)
    └── UpstreamError              502 the engine answered with something unusable
        ├── UpstreamUnavailable    503 the engine cannot be reached (carries Retry-After)
        │   └── EngineAtCapacity   503 the engine refused a request for want of a lane (retried first)
        └── UpstreamTimeout        504 the engine stayed silent past api.upstream_timeout_s

A serving function *returns* a client error as a value; routes and middleware turn it into a
response with :func:`error_body` in the dialect of the route: OpenAI
``{"error": {"message", "type", "param", "code"}}`` or Anthropic
``{"type": "error", "error": {"type", "message"}}`` on ``/v1/messages*``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import ValidationError
from starlette.responses import JSONResponse

from sparkfold.protocol import error_location, field_error

__all__ = [
    "RETRY_AFTER_S",
    "ApiError",
    "ClientError",
    "EngineAtCapacity",
    "InvalidRequest",
    "LimitExceeded",
    "NotFound",
    "Overloaded",
    "Unauthorized",
    "UpstreamError",
    "UpstreamTimeout",
    "UpstreamUnavailable",
    "error_body",
    "error_bytes",
    "error_response",
    "invalid_fields",
    "is_anthropic_path",
    "untranslatable",
]

RETRY_AFTER_S = 5

_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "overloaded_error",
    500: "api_error",
    502: "api_error",
    503: "api_error",
    504: "api_error",
}


class ApiError(Exception):
    """An error with an HTTP status and a message for the client."""

    status = 500
    type = "server_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code

    @property
    def headers(self) -> dict[str, str]:
        return {}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.status}, {self.message!r}, param={self.param!r})"


class ClientError(ApiError):
    status = 400
    type = "invalid_request_error"


class InvalidRequest(ClientError):
    pass


class LimitExceeded(ClientError):
    def __init__(self, message: str, *, param: str | None = None, status: int = 400) -> None:
        super().__init__(message, param=param, code="limit_exceeded")
        self.status = status


class Unauthorized(ClientError):
    status = 401
    type = "authentication_error"


class NotFound(ClientError):
    status = 404
    type = "not_found_error"


class _RetryLater(ApiError):
    """An error a client should send again after ``retry_after_s`` (the ``Retry-After`` header)."""

    retry_after_s = RETRY_AFTER_S

    @property
    def headers(self) -> dict[str, str]:
        return {"retry-after": str(self.retry_after_s)}


class Overloaded(_RetryLater, ClientError):
    status = 429
    type = "rate_limit_error"

    def __init__(self, message: str, *, retry_after_s: int = RETRY_AFTER_S) -> None:
        super().__init__(message, code="overloaded")
        self.retry_after_s = retry_after_s


class UpstreamError(ApiError):
    status = 502
    type = "upstream_error"


class UpstreamUnavailable(_RetryLater, UpstreamError):
    """The engine is gone (stopped, restarting after a crash or a memory kill): send it again later."""

    status = 503
    type = "upstream_unavailable"


class EngineAtCapacity(UpstreamUnavailable):
    """The engine refused for want of a lane (code ``capacity``): the gateway asks again first."""


class UpstreamTimeout(UpstreamError):
    status = 504
    type = "upstream_timeout"


def untranslatable(exc: ValidationError) -> InvalidRequest:
    """A request of another dialect that does not translate into a valid chat request: one 400 that
    names the first field the chat request refused."""
    return InvalidRequest(
        f"cannot translate the request: {field_error(exc)}", param=error_location(exc.errors()[0]) or None
    )


def invalid_fields(errors: Sequence[Mapping[str, Any]]) -> InvalidRequest:
    """Validation errors (pydantic's ``errors()``, FastAPI's ``loc`` starting with ``body``) as one
    400 that names the first field and lists up to three problems. Where a union's members failed
    at one field, each in its own way, the problems sparkfold's validators raised (``value_error``:
    what is wrong with the value) are said, not the type errors of the members it was not meant for."""
    said = {error_location(e) for e in errors if e.get("type") == "value_error"}
    problems: list[tuple[str, str]] = []
    for error in errors:
        location = error_location(error)
        if location in said and error.get("type") != "value_error":
            continue
        message = str(error.get("msg", "invalid")).removeprefix("Value error, ")
        if (location, message) not in problems:
            problems.append((location, message))
    parts = [f"{location or 'body'}: {message}" for location, message in problems[:3]]
    first = next((location for location, _ in problems if location), None)
    more = len(problems) - 3
    suffix = f" (and {more} more)" if more > 0 else ""
    return InvalidRequest("invalid request: " + "; ".join(parts) + suffix, param=first)


def is_anthropic_path(path: str) -> bool:
    return path.startswith(("/v1/messages", "/messages"))


def error_body(error: ApiError, *, anthropic: bool = False) -> dict[str, Any]:
    """The JSON body of ``error`` in the OpenAI or the Anthropic shape."""
    if anthropic:
        kind = _ANTHROPIC_TYPES.get(error.status, "api_error" if error.status >= 500 else error.type)
        return {"type": "error", "error": {"type": kind, "message": error.message}}
    return {"error": {"message": error.message, "type": error.type, "param": error.param, "code": error.code}}


def error_bytes(error: ApiError, *, anthropic: bool = False) -> bytes:
    return json.dumps(error_body(error, anthropic=anthropic), ensure_ascii=False).encode()


def error_response(error: ApiError, path: str) -> JSONResponse:
    """``error`` as a JSON response (an ASGI app) in the dialect of ``path``."""
    return JSONResponse(
        error_body(error, anthropic=is_anthropic_path(path)),
        status_code=error.status,
        headers=error.headers,
    )
