"""The fleet's public endpoint on the router host: our keys, then SMG (or a pair) behind them.

Why this front exists, route by route (SMG 1.13.0, checked against our gateways):

- **Keys.** SMG's own data-plane key is one plain-text key, given on its command line, checked only
  as ``Authorization: Bearer`` (the Anthropic SDK's ``x-api-key`` is refused). Clients here use our
  keys file (``sha256:`` lines, SIGHUP reload, required off loopback), both header styles.
- **``/tokenize``, ``/detokenize``.** SMG answers 404. Every pair serves the same weights and chat
  template, so the first pair that is in answers them.
- **``/health``, ``/metrics``.** SMG's views are its own (``/workers`` behind the control-plane key,
  ``smg_*`` metrics on loopback); here they are joined with each pair's (:mod:`sparkfold.fleet.pairs`).
- **Everything a client generates with** (``/v1/chat/completions``, ``/v1/completions``,
  ``/v1/responses``, ``/v1/messages``, ``count_tokens``, ``/v1/models``) passes to SMG unchanged,
  which picks the pair. Other paths (SMG's admin routes among them) answer 404 here.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from sparkfold.api.errors import NotFound, UpstreamUnavailable, error_response
from sparkfold.api.keys import KeyStore
from sparkfold.api.middleware import Auth, BodyLimit, RequestId, ServerErrors
from sparkfold.fleet.pairs import FleetView
from sparkfold.fleet.proxy import Upstream
from sparkfold.fleet.settings import FleetSettings, read_secret
from sparkfold.units import MIB

__all__ = ["OPEN_PATHS", "ROUTED", "FleetApp"]

OPEN_PATHS = frozenset({"/health", "/v1/health"})
# What SMG carries for clients: the generating routes and the model list.
ROUTED = re.compile(
    r"^/v1/(chat/completions|completions|messages|messages/count_tokens|models(/[^/]+)?"
    r"|responses(/[^/]+(/input_items|/cancel)?)?)$"
)


class FleetApp:
    """The front as an ASGI application; ``view`` answers health and metrics, ``router`` is SMG."""

    def __init__(self, fleet: FleetSettings, *, transport: httpx.AsyncBaseTransport | None = None) -> None:
        front, router = fleet.front, fleet.router
        key = read_secret(router.key_file, "the router key file")
        timeout = httpx.Timeout(front.upstream_timeout_s, connect=5.0)
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        self.client = httpx.AsyncClient(timeout=timeout, limits=limits, transport=transport)
        self.router = Upstream(self.client, router.url, key, "the fleet router (sparkfold-router)")
        control_key = read_secret(router.control_key_file, "the router control key file")
        control = Upstream(self.client, router.url, control_key, "SMG's control plane")
        metrics = Upstream(self.client, router.metrics_url, key, "SMG's metrics")
        self.keys = KeyStore(front.api_keys_file)
        self.view = FleetView(router=self.router, control=control, metrics=metrics, pairs={})
        self.key = key
        self.reload_pairs(fleet)

        @asynccontextmanager
        async def lifespan(_: Starlette) -> AsyncIterator[None]:
            yield
            await self.client.aclose()

        routes = [
            Route("/health", self._health, methods=["GET"]),
            Route("/v1/health", self._health, methods=["GET"]),
            Route("/metrics", self._metrics, methods=["GET"]),
            Route("/tokenize", self._to_a_pair, methods=["POST"]),
            Route("/detokenize", self._to_a_pair, methods=["POST"]),
            Route("/{path:path}", self._to_router, methods=["GET", "POST", "DELETE"]),
        ]
        app: ASGIApp = Starlette(routes=routes, lifespan=lifespan)
        app = BodyLimit(app, max_bytes=int(front.max_body_mib * MIB))
        app = Auth(app, keys=self.keys, required=front.keys_required, open_paths=OPEN_PATHS)
        app = RequestId(app)
        self._stack = ServerErrors(app)

    def reload_pairs(self, fleet: FleetSettings) -> None:
        """Take the ``[[pairs]]`` of ``fleet`` (SIGHUP: a pair added, drained or back)."""
        self.view.settings = list(fleet.pairs)
        self.view.pairs = {
            pair.name: Upstream(self.client, pair.url, self.key, f"pair {pair.name}") for pair in fleet.pairs
        }

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._stack(scope, receive, send)

    async def _health(self, request: Request) -> Response:
        health = await self.view.health()
        return JSONResponse(health.model_dump(by_alias=True), status_code=200 if health.ok else 503)

    async def _metrics(self, request: Request) -> Response:
        return PlainTextResponse(await self.view.metrics_text(), media_type="text/plain; version=0.0.4")

    async def _to_a_pair(self, request: Request) -> Response:
        pairs = await self.view.pairs_in()
        if not pairs:
            error = UpstreamUnavailable("no pair is in service (see /health)")
            return error_response(error, request.url.path)
        return await self.view.pairs[pairs[0].name].forward(request)

    async def _to_router(self, request: Request) -> Response:
        if not ROUTED.match(request.url.path):
            error = NotFound(
                f"no route {request.method} {request.url.path} on the fleet endpoint; it serves /v1/chat/"
                "completions, /v1/completions, /v1/responses, /v1/messages, /v1/models, /tokenize, "
                "/detokenize, /health and /metrics"
            )
            return error_response(error, request.url.path)
        return await self.router.forward(request)
