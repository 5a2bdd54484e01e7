"""The base of the gateway's pure ASGI middleware: HTTP requests go to ``handle``; every other
scope (lifespan, websocket) passes straight through to the app."""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send


class HttpMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.handle(scope, receive, send)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        """One HTTP request (a subclass's job)."""
        raise NotImplementedError
