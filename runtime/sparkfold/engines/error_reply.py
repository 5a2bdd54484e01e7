"""How the engine server refuses a request: :class:`ErrorReply`, an HTTP status plus OpenAI's error body.

Every client mistake, capacity refusal and engine failure the server answers is one of these;
``server.py`` turns it into its JSON response, a stream into its error event.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkfold.engines.generator import EngineGone
from sparkfold.protocol import ErrorInfo, ErrorResponse

__all__ = ["ErrorReply", "unavailable"]


@dataclass(frozen=True)
class ErrorReply:
    """A refused request: HTTP status plus the OpenAI error body."""

    status: int
    message: str
    param: str | None = None
    code: str | None = None
    type: str = "invalid_request_error"

    def body(self) -> ErrorResponse:
        return ErrorResponse(
            error=ErrorInfo(message=self.message, type=self.type, param=self.param, code=self.code)
        )


def unavailable(exc: EngineGone) -> ErrorReply:
    """The engine's process is gone: 503 ``engine_unavailable`` (retried by clients and the gateway)."""
    return ErrorReply(503, str(exc), None, "engine_unavailable", "server_error")
