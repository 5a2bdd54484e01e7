"""The HTTP side of the engine protocol for our own engines (``docs/engine-protocol.md``).

:func:`create_app` wires an :class:`~sparkfold.engines.service.EngineService` to routes: HTTP
only. :class:`~sparkfold.engines.error_reply.ErrorReply` values become their status with the OpenAI
error body; the generating routes' JSON and SSE (role delta first, content deltas, a final chunk
with ``finish_reason``, the ``tensorfold`` stats block and ``usage``, then ``data: [DONE]``; one
choice after another when there are several) are built in :mod:`sparkfold.engines.replies`.
Bodies are parsed here, not by FastAPI, so every client mistake is a 400 that names the field.

Every generating route runs under :class:`~sparkfold.asgi.DirectRoutes`' cancellation (a client
that leaves stops its generation, streamed or not); prompt work runs off the event loop
(:class:`~sparkfold.engines.prompt_workers.PromptWorkers`); a stream that has sent nothing for
:data:`HEARTBEAT_S` gets a ``: keepalive`` comment while the engine makes progress (a long prompt
is being read), so the gateway and any proxy in between know the engine is alive.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from typing import TypeVar

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException

from sparkfold.asgi import (
    SSE_HEADERS,
    DirectRoutes,
    EventStream,
    Pacing,
    SSEResponse,
    StreamResponse,
    methods_on,
)
from sparkfold.engines.error_reply import ErrorReply
from sparkfold.engines.replies import chat_reply, chat_stream, completion_reply, completion_stream
from sparkfold.engines.service import EngineService
from sparkfold.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    DetokenizeResponse,
    ModelCard,
    ModelList,
    TokenizeRequest,
    TokenizeResponse,
    error_location,
    field_error,
)

__all__ = ["create_app"]

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)
P = TypeVar("P")
_STREAM_HEADERS = (*SSE_HEADERS, (b"connection", b"close"))
HEARTBEAT_S = 5.0
"""A stream silent this long gets a ``: keepalive`` comment (while the engine makes progress)."""
SEND_TIMEOUT_S = 60.0
"""A client that has not taken one write for this long stopped reading: its stream ends."""


def _stream(events: AsyncIterator[bytes], pacing: Pacing) -> StreamResponse:
    """SSE that stops the generation when the client leaves (closing ``events`` cancels it)."""
    return StreamResponse(SSEResponse(EventStream(events), _STREAM_HEADERS, pacing))


def _error(error: ErrorReply) -> JSONResponse:
    return JSONResponse(error.body().model_dump(), status_code=error.status)


def _whole(answer: BaseModel | ErrorReply) -> JSONResponse:
    """A whole (not streamed) reply, or its error."""
    if isinstance(answer, ErrorReply):
        return _error(answer)
    return JSONResponse(answer.model_dump(exclude_none=True))


async def _parse(request: Request, model: type[M]) -> M | ErrorReply:
    """The body as ``model``, or a 400 naming the first bad field."""
    try:
        data = json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return ErrorReply(400, f"the request body is not valid JSON: {exc}", None, "invalid_json")
    if not isinstance(data, dict):
        return ErrorReply(400, "the request body must be a JSON object", None, "invalid_json")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        return ErrorReply(400, field_error(exc), error_location(exc.errors()[0]) or None)


async def _admit(
    service: EngineService,
    request: Request,
    model: type[M],
    prepare: Callable[[M], P | ErrorReply],
) -> tuple[M, P] | JSONResponse:
    """A generating request parsed, prepared off the loop and given a lane, or its error reply."""
    body = await _parse(request, model)
    if isinstance(body, ErrorReply):
        return _error(body)
    prepared = await service.workers.run(prepare, body, body_bytes=len(await request.body()))
    if isinstance(prepared, ErrorReply):
        return _error(prepared)
    refused = await service.capacity.wait_for_lane()
    if refused is not None:
        return _error(refused)
    return body, prepared


def create_app(service: EngineService, *, heartbeat_s: float = HEARTBEAT_S) -> DirectRoutes:
    """The engine server's ASGI app: FastAPI, with the two generating routes run directly."""
    app = FastAPI(title="sparkfold engine", docs_url=None, redoc_url=None, openapi_url=None)
    name = service.served_name
    pacing = Pacing(keepalive_s=heartbeat_s, send_timeout_s=SEND_TIMEOUT_S, alive=service.generator.healthy)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
        code = "not_found" if exc.status_code == 404 else None
        message = f"{request.method} {request.url.path}: {exc.detail}"
        if exc.status_code != 405:
            return _error(ErrorReply(exc.status_code, message, None, code))
        allowed = ", ".join(methods_on(app.routes, request.scope))
        response = _error(ErrorReply(405, f"{message}; it answers {allowed}", None, "method_not_allowed"))
        response.headers["Allow"] = allowed
        return response

    @app.get("/v1/models")
    @app.get("/models")
    async def models() -> JSONResponse:
        card = ModelCard(
            id=name, max_model_len=service.generator.context_length, capabilities=service.capabilities()
        )
        return JSONResponse(ModelList(data=[card]).model_dump())

    @app.get("/health")
    @app.get("/v1/health")
    async def health() -> JSONResponse:
        state = service.health()
        return JSONResponse(state.model_dump(exclude_none=True), status_code=200 if state.ok else 503)

    @app.get("/metrics")
    @app.get("/v1/metrics")
    async def metrics() -> Response:
        body = service.counters.exposition() + service.generator.metrics_text().encode()
        return Response(body, media_type="text/plain; version=0.0.4")

    @app.post("/tokenize")
    @app.post("/v1/tokenize")
    async def tokenize(request: Request) -> JSONResponse:
        body = await _parse(request, TokenizeRequest)
        if isinstance(body, ErrorReply):
            return _error(body)
        if body.messages is not None:
            chat = ChatCompletionRequest(
                messages=body.messages,
                tools=body.tools,
                chat_template_kwargs=body.chat_template_kwargs,
                reasoning_effort=body.reasoning_effort,
            )
            rendered = await service.workers.run(service.requests.tokenize_chat, chat)
            if isinstance(rendered, ErrorReply):
                return _error(rendered)
            ids = rendered
        elif body.prompt is not None:
            ids = await service.workers.run(_encode, service, body.prompt, body.add_special_tokens)
        else:
            return _error(ErrorReply(400, "give either prompt or messages", "prompt"))
        strs = None
        if body.return_token_strs:
            strs = await service.workers.run(service.generator.token_strs, ids)
        answer = TokenizeResponse(
            count=len(ids), max_model_len=service.generator.context_length, tokens=ids, token_strs=strs
        )
        return JSONResponse(answer.model_dump(exclude_none=True))

    @app.post("/detokenize")
    @app.post("/v1/detokenize")
    async def detokenize(request: Request) -> JSONResponse:
        body = await _parse(request, DetokenizeRequest)
        if isinstance(body, ErrorReply):
            return _error(body)
        bad = service.requests.invalid_token_ids(body.tokens)
        if bad:
            return _error(ErrorReply(400, bad, "tokens"))
        return JSONResponse(DetokenizeResponse(prompt=service.generator.decode(body.tokens)).model_dump())

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        prepare = service.requests.prepare_chat_choices
        admitted = await _admit(service, request, ChatCompletionRequest, prepare)
        if isinstance(admitted, JSONResponse):
            return admitted
        body, choices = admitted
        if body.stream:
            options = body.stream_options or {}
            usage_chunk = bool(options.get("include_usage"))
            prompt_usage = bool(options.get("continuous_usage_stats"))
            return _stream(chat_stream(service, choices, usage_chunk, prompt_usage), pacing)
        return _whole(await chat_reply(service, choices, body.return_token_ids))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        admitted = await _admit(service, request, CompletionRequest, service.requests.prepare_completion)
        if isinstance(admitted, JSONResponse):
            return admitted
        body, choices = admitted
        if body.stream:
            usage_chunk = bool((body.stream_options or {}).get("include_usage"))
            return _stream(completion_stream(service, choices, usage_chunk), pacing)
        return _whole(await completion_reply(service, choices, body.return_token_ids))

    return DirectRoutes(app, {"/v1/chat/completions": chat, "/v1/completions": completions})


def _encode(service: EngineService, text: str, add_special_tokens: bool) -> list[int]:
    return service.requests.encode(text, add_special_tokens=add_special_tokens)
