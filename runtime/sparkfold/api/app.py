"""Compose the gateway: serving objects, routers, and the middleware stack around them.

:func:`create_app` builds everything from :class:`~sparkfold.config.Settings` and returns an
:class:`App` (an ASGI application). ``connect`` replaces the network to the engine in tests (see
:mod:`sparkfold.api.upstream`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from sparkfold import __version__
from sparkfold.api import openapi, routes
from sparkfold.api.anthropic import routes as anthropic_routes
from sparkfold.api.anthropic.serving import MessagesServing
from sparkfold.api.body_shape import BodyShape
from sparkfold.api.capabilities import Capabilities, EngineStart
from sparkfold.api.dispatch import Dispatch
from sparkfold.api.errors import (
    ApiError,
    ClientError,
    InvalidRequest,
    NotFound,
    error_response,
    invalid_fields,
)
from sparkfold.api.health import HealthServing, PeerSource
from sparkfold.api.keys import KeyStore
from sparkfold.api.lanes import TOKENIZER_LANES, TOKENIZER_QUEUE, Lanes
from sparkfold.api.limits import UploadLimits
from sparkfold.api.metrics import EngineLoad, MemoryKills, Metrics
from sparkfold.api.middleware import Admission, Auth, BodyLimit, Observe, RequestId, ServerErrors
from sparkfold.api.middleware.auth import is_preflight
from sparkfold.api.model_names import ModelNames
from sparkfold.api.models import ModelsServing
from sparkfold.api.openai import routes as openai_routes
from sparkfold.api.openai.serving import ChatServing, CompletionServing, UtilityServing
from sparkfold.api.responses import routes as responses_routes
from sparkfold.api.responses.serving import ResponsesServing
from sparkfold.api.responses.store import ResponseStore
from sparkfold.api.sealed import ReasoningSeal
from sparkfold.api.state import Gateway
from sparkfold.api.upstream import Connect, Engine
from sparkfold.asgi import PACING_KEY, Pacing, methods_on
from sparkfold.config import Settings
from sparkfold.units import MIB

__all__ = ["GENERATING_PATHS", "OPEN_PATHS", "TOKENIZING_PATHS", "App", "build_stack", "create_app"]

# Routes that make the engine generate: they take a lane.
GENERATING_PATHS = frozenset(
    {"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/messages", "/messages"}
)
# Routes that make the engine tokenize: they take a lane of the tokenizer's own (lanes.TOKENIZER_LANES).
TOKENIZING_PATHS = frozenset(
    {
        "/tokenize",
        "/v1/tokenize",
        "/detokenize",
        "/v1/detokenize",
        "/v1/messages/count_tokens",
        "/messages/count_tokens",
    }
)
# Routes answered without an API key.
OPEN_PATHS = frozenset({"/health", "/v1/health", "/docs", "/openapi.json"})


def build_stack(app: ASGIApp, gateway: Gateway, settings: Settings) -> ASGIApp:
    """Wrap ``app`` in the middleware, innermost first; the comment on each says why it sits there."""
    api = settings.api
    # innermost: gives the serving code a way to take a lane, which it does only once the request
    # passed every check of its own (validation, limits), just before the engine is asked
    app = Admission(app, lanes=gateway.lanes, paths=GENERATING_PATHS, metrics=gateway.metrics)
    app = Admission(app, lanes=gateway.tokenizer_lanes, paths=TOKENIZING_PATHS, metrics=gateway.metrics)
    # before admission: a too-large body is refused before it is buffered for the queue
    shape = BodyShape(max_text_bytes=int(api.max_text_body_mib * MIB), max_values=api.max_json_values)
    app = BodyLimit(app, max_bytes=int(api.max_body_mib * MIB), shape=shape)
    # before the body is read at all: unauthenticated clients cost nothing
    app = Auth(app, keys=gateway.keys, required=api.keys_required, open_paths=OPEN_PATHS)
    # sees every final status, 401/413/429 included
    app = Observe(app, metrics=gateway.metrics)
    # outside auth: a browser's preflight OPTIONS carries no key; errors get CORS headers too
    if api.cors_allowed_origins:
        app = CORSMiddleware(
            app,
            allow_origins=api.cors_allowed_origins,
            allow_methods=["GET", "POST", "DELETE", "OPTIONS"],
            allow_headers=["*"],
            expose_headers=["x-request-id", "retry-after"],
            max_age=600,
        )
    # every log line and response, errors included, carries the id
    app = RequestId(app)
    # outermost: nothing escapes as a dropped connection
    return ServerErrors(app)


def _base_url_hint(routes: Sequence[BaseRoute], scope: Scope) -> str:
    """Where a client's base URL is off by ``/v1`` (OpenAI SDKs want it, Anthropic's must not have
    it): the route it meant, and how to set it."""
    path: str = scope["path"]
    for meant, advice in (
        (f"/v1{path}", "end base_url with /v1"),
        (path.removeprefix("/v1"), "leave /v1 off base_url"),
    ):
        if meant.startswith("/v1/") and meant != path and methods_on(routes, {**scope, "path": meant}):
            return f" (the route is {meant}: {advice})"
    return ""


def _install_error_handlers(app: FastAPI, routes: Sequence[BaseRoute]) -> None:
    """``routes``: every route with its methods (FastAPI's router holds included routers whole)."""

    async def on_validation(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RequestValidationError)
        return error_response(invalid_fields(exc.errors()), request.url.path)

    async def on_http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        error: ApiError
        headers = dict(exc.headers or {})
        if exc.status_code == 404:
            hint = _base_url_hint(routes, request.scope)
            error = NotFound(f"no route {request.method} {request.url.path}{hint}; see /docs")
        elif exc.status_code == 405:
            # starlette's Allow names the first route on the path only (/v1/responses/{id}: GET, not DELETE)
            allowed = methods_on(routes, request.scope)
            headers["Allow"] = ", ".join(allowed)
            error = ClientError(
                f"{request.method} is not served on {request.url.path}; it answers {', '.join(allowed)} "
                "(see /docs)"
                + (
                    "; this is a CORS preflight, and CORS is off: set [api] cors_allowed_origins to "
                    "let browsers call the API"
                    if is_preflight(request.scope)
                    else ""
                )
            )
            error.status = 405
        else:
            error = ClientError(str(exc.detail))
            error.status = exc.status_code
        response = error_response(error, request.url.path)
        response.headers.update(headers)
        return response

    async def on_recursion(request: Request, exc: Exception) -> Response:
        return error_response(InvalidRequest("the JSON body nests too deeply"), request.url.path)

    async def on_bug(request: Request, exc: Exception) -> Response:
        # starlette's ServerErrorMiddleware calls this for anything unhandled (then re-raises it,
        # so ServerErrors logs the traceback): the client still gets JSON in its dialect
        request_id = request.scope.get("state", {}).get("request_id")
        error = ApiError(f"internal error (request id {request_id}); the gateway log has the details")
        return error_response(error, request.url.path)

    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(HTTPException, on_http)
    app.add_exception_handler(RecursionError, on_recursion)
    app.add_exception_handler(Exception, on_bug)


class App:
    """The gateway as an ASGI application; ``gateway`` holds its long-lived objects.

    ``peer_state``: the peer rank's state when the engine's ``/health`` has none;
    ``engine_start``: what identifies the engine's current start (capabilities are asked once a start);
    ``engine_load``: the serving rank's last cold load in seconds (``sparkfold_engine_load_seconds``);
    ``memory_kills``: the memory guard's kills of this rank (``sparkfold_engine_memory_kills_total``)."""

    def __init__(
        self,
        settings: Settings,
        *,
        connect: Connect | None = None,
        peer_state: PeerSource | None = None,
        engine_start: EngineStart | None = None,
        engine_load: EngineLoad | None = None,
        memory_kills: MemoryKills | None = None,
    ) -> None:
        api = settings.api
        engine = Engine(
            settings.engine_url,
            timeout_s=api.upstream_timeout_s,
            first_token_timeout_s=api.first_token_timeout_s,
            connect=connect,
            concurrency=api.parallel + TOKENIZER_LANES + 2,  # the lanes, the tokenizer's, health and metrics
        )
        lanes = Lanes(api.parallel, api.max_queued)
        metrics = Metrics(lanes, engine_load, memory_kills)
        served = settings.engine.served_name
        names = ModelNames(served, api.model_aliases)
        capabilities = Capabilities(engine, engine_start)
        seal = ReasoningSeal()  # this start's key for the reasoning clients send back
        chat = ChatServing(
            engine=engine,
            capabilities=capabilities,
            metrics=metrics,
            limits=UploadLimits.of(api),
            keepalive_s=api.keepalive_s,
            served_name=served,
            names=names,
        )
        tokenizer_knobs = "the tokenizer routes' own lanes, apart from the generating ones"
        self.gateway = Gateway(
            engine=engine,
            lanes=lanes,
            tokenizer_lanes=Lanes(TOKENIZER_LANES, TOKENIZER_QUEUE, knobs=tokenizer_knobs),
            metrics=metrics,
            keys=KeyStore(api.api_keys_file),
            chat=chat,
            completion=CompletionServing(
                engine=engine,
                capabilities=capabilities,
                metrics=metrics,
                keepalive_s=api.keepalive_s,
                served_name=served,
                names=names,
            ),
            utility=UtilityServing(engine=engine, limits=chat.limits, names=names),
            models=ModelsServing(engine=engine, served_name=served, names=names),
            messages=MessagesServing(chat=chat, engine=engine, seal=seal),
            responses=ResponsesServing(chat=chat, store=ResponseStore.from_settings(api), seal=seal),
            health=HealthServing(
                engine=engine,
                lanes=lanes,
                metrics=metrics,
                engine_lanes=settings.engine.parallel,
                peer_state=peer_state,
            ),
        )

        @asynccontextmanager
        async def lifespan(_: FastAPI) -> AsyncIterator[None]:
            yield
            await engine.aclose()

        self.fastapi = FastAPI(
            title="sparkfold",
            version=__version__,
            description="OpenAI- and Anthropic-compatible API in front of one engine server",
            lifespan=lifespan,
            docs_url=None,  # openapi.install serves /docs without a CDN script
            redoc_url=None,
        )
        openapi.install(self.fastapi, open_paths=OPEN_PATHS)
        self.fastapi.state.gateway = self.gateway
        routers = (routes.router, openai_routes.router, anthropic_routes.router, responses_routes.router)
        for router in routers:
            self.fastapi.include_router(router)
        api_routes = [route for r in routers for route in r.routes]
        _install_error_handlers(self.fastapi, [*self.fastapi.router.routes, *api_routes])
        direct = Dispatch(self.fastapi, routes=api_routes, paths=GENERATING_PATHS)
        self._stack = build_stack(direct, self.gateway, settings)
        self._pacing = Pacing(keepalive_s=api.keepalive_s, send_timeout_s=api.send_timeout_s)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":  # every stream keeps its client alive and drops a stopped reader
            scope.setdefault("state", {})[PACING_KEY] = self._pacing
        await self._stack(scope, receive, send)


create_app = App
"""The gateway app: :class:`App` under the name the server and the tests call."""
