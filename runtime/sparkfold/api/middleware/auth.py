"""API keys: ``Authorization: Bearer KEY`` or ``x-api-key: KEY``; open paths need none.

An accepted key's digest becomes the request's tenant (``scope["state"]["tenant"]``): what a
request stores (``/v1/responses``) belongs to it. Without keys everyone is the one tenant ``""``.
``scope["state"]["trusted"]`` says a request may see the whole ``/health`` (an accepted key, or
keys not in force).

A CORS preflight (``OPTIONS`` with ``Origin`` and ``Access-Control-Request-Method``) never carries
credentials (the Fetch standard sends it without them), so it is never refused for want of a key:
with CORS on, the CORS middleware outside answers it before it gets here; with CORS off it goes on
to the router, which serves no ``OPTIONS`` and answers 405 without CORS headers, as a Starlette app
without ``CORSMiddleware`` does: the browser then refuses the cross-origin call itself.
"""

from __future__ import annotations

from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from sparkfold.api.errors import Unauthorized, error_response
from sparkfold.api.keys import KeyStore, tenant_of
from sparkfold.api.middleware.base import HttpMiddleware


def presented_key(headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    for name, value in headers:
        if name == b"x-api-key":
            return value.decode("latin-1").strip()
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer":
                return token.strip()
    return None


def is_preflight(scope: Scope) -> bool:
    """A CORS preflight, as Starlette's ``CORSMiddleware`` tells one (plus the ``Origin`` it needs)."""
    names = {name for name, _ in scope["headers"]}
    return scope["method"] == "OPTIONS" and {b"origin", b"access-control-request-method"} <= names


class Auth(HttpMiddleware):
    """Refuse requests without an accepted key while ``keys`` holds any (or ``required`` is set)."""

    def __init__(self, app: ASGIApp, *, keys: KeyStore, required: bool, open_paths: Iterable[str]) -> None:
        super().__init__(app)
        self.keys = keys
        self.required = required
        self.open_paths = frozenset(open_paths)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self.required and len(self.keys) == 0:
            scope.setdefault("state", {})["trusted"] = True
            await self.app(scope, receive, send)
            return
        key = presented_key(scope["headers"])
        # answered anyway (a preflight has no key to give); a valid key sees more (/health)
        if scope["path"] in self.open_paths or is_preflight(scope):
            if key is not None and self.keys.accepts(key):
                scope.setdefault("state", {})["trusted"] = True
            await self.app(scope, receive, send)
            return
        if key is None:
            error = Unauthorized("no API key: send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'")
        elif not self.keys.accepts(key):
            error = Unauthorized("the API key is not accepted (check it against api.api_keys_file)")
        else:
            scope.setdefault("state", {}).update(tenant=tenant_of(key), trusted=True)
            await self.app(scope, receive, send)
            return
        await error_response(error, scope["path"])(scope, receive, send)
