"""Refuse request bodies past ``api.max_body_mib`` with 413, before anything buffers them, and
bodies whose parse would cost far more than their size (:mod:`sparkfold.api.body_shape`) with
413 before they are parsed.

A body within the limits is read once and handed on twice: replayed through ``receive`` (for
apps that read it, like FastAPI) and kept as ``scope["state"]["body"]``.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from sparkfold.api.body_shape import BodyShape
from sparkfold.api.errors import LimitExceeded, error_response
from sparkfold.asgi import BodyTooLarge, ClientGone, read_body, replay
from sparkfold.units import MIB


class BodyLimit:
    def __init__(self, app: ASGIApp, *, max_bytes: int, shape: BodyShape | None = None) -> None:
        if max_bytes < 1:
            raise ValueError("max_bytes must be positive")
        self.app = app
        self.max_bytes = max_bytes
        self.shape = shape

    def _error(self) -> LimitExceeded:
        mib = self.max_bytes / MIB
        return LimitExceeded(
            f"the request body is larger than {mib:g} MiB (api.max_body_mib); send less, "
            "e.g. fewer or smaller images",
            param="body",
            status=413,
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS", "DELETE"):
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                await error_response(self._error(), scope["path"])(scope, receive, send)
                return
        try:
            body = await read_body(receive, self.max_bytes)
        except ClientGone:
            return
        except BodyTooLarge:
            await error_response(self._error(), scope["path"])(scope, receive, send)
            return
        refused = self.shape.check(body) if self.shape is not None else None
        if refused is not None:
            error = LimitExceeded(refused, param="body", status=413)
            await error_response(error, scope["path"])(scope, receive, send)
            return
        scope.setdefault("state", {})["body"] = body  # for whoever wants it without a receive
        await self.app(scope, replay(body, receive), send)
