"""The HTTP side of the engine protocol for our own engines (``docs/engine-protocol.md``).

:func:`create_app` wires an :class:`~sparkfold.engines.serving.EngineService` to routes: HTTP
only. Results become JSON, :class:`~sparkfold.engines.serving.ApiError` values become their status
with the OpenAI error body, streams become SSE (role delta first, content deltas, a final chunk
with ``finish_reason``, the ``tensorfold`` stats block and ``usage``, then ``data: [DONE]``).
Bodies are parsed here, not by FastAPI, so every client mistake is a 400 that names the field.

Every generating route runs under :class:`~sparkfold.asgi.DirectRoutes`' cancellation (a client
that leaves stops its generation, streamed or not); prompt work runs off the event loop
(:meth:`EngineService.off_loop`); a stream that has sent nothing for :data:`HEARTBEAT_S` gets a
``: keepalive`` comment while the engine makes progress (a long prompt is being read), so the
gateway and any proxy in between know the engine is alive.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException

from sparkfold.asgi import SSE_HEADERS, DirectRoutes, EventStream, Pacing, SSEResponse, StreamResponse
from sparkfold.engines.generator import CapacityError, EngineFailure
from sparkfold.engines.output import OutputParser
from sparkfold.engines.serving import ApiError, EngineService, Outcome, Prepared
from sparkfold.protocol import (
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    Choice,
    ChunkChoice,
    Completion,
    CompletionChoice,
    CompletionRequest,
    Delta,
    DetokenizeRequest,
    DetokenizeResponse,
    ModelCard,
    ModelList,
    ResponseMessage,
    TokenizeRequest,
    TokenizeResponse,
    ToolCall,
    Usage,
    new_id,
)
from sparkfold.sse import SSE_DONE, TextEvents, sse_event

__all__ = ["create_app"]

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)
_STREAM_HEADERS = (*SSE_HEADERS, (b"connection", b"close"))
HEARTBEAT_S = 5.0
"""A stream silent this long gets a ``: keepalive`` comment (while the engine makes progress)."""
SEND_TIMEOUT_S = 60.0
"""A client that has not taken one write for this long stopped reading: its stream ends."""


def _stream(events: AsyncIterator[bytes], pacing: Pacing) -> StreamResponse:
    """SSE that stops the generation when the client leaves (closing ``events`` cancels it)."""
    return StreamResponse(SSEResponse(EventStream(events), _STREAM_HEADERS, pacing))


def _error(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body().model_dump(), status_code=error.status)


async def _parse(request: Request, model: type[M]) -> M | ApiError:
    """The body as ``model``, or a 400 naming the first bad field."""
    try:
        data = json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return ApiError(400, f"the request body is not valid JSON: {exc}", None, "invalid_json")
    if not isinstance(data, dict):
        return ApiError(400, "the request body must be a JSON object", None, "invalid_json")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(part) for part in first["loc"]) or None
        return ApiError(400, f"{param}: {first['msg']}" if param else str(first["msg"]), param)


async def _admit(
    service: EngineService,
    request: Request,
    model: type[M],
    prepare: Callable[[M], Prepared | ApiError],
) -> tuple[M, Prepared] | JSONResponse:
    """A generating request parsed, prepared off the loop and given a lane, or its error reply."""
    body = await _parse(request, model)
    if isinstance(body, ApiError):
        return _error(body)
    prepared = await service.off_loop(prepare, body)
    if isinstance(prepared, ApiError):
        return _error(prepared)
    refused = await service.wait_for_lane()
    if refused is not None:
        return _error(refused)
    return body, prepared


def _outcome_error(exc: BaseException) -> ApiError:
    if isinstance(exc, CapacityError):
        return ApiError(503, str(exc), None, "capacity", "server_error")
    if isinstance(exc, EngineFailure):
        log.error("generation failed: %s", exc)
    else:
        log.exception("generation failed")
    return ApiError(500, f"generation failed: {exc}", None, "engine_error", "server_error")


def create_app(service: EngineService, *, heartbeat_s: float = HEARTBEAT_S) -> DirectRoutes:
    """The engine server's ASGI app: FastAPI, with the two generating routes run directly."""
    app = FastAPI(title="sparkfold engine", docs_url=None, redoc_url=None, openapi_url=None)
    name = service.served_name
    pacing = Pacing(keepalive_s=heartbeat_s, send_timeout_s=SEND_TIMEOUT_S, alive=service.generator.healthy)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
        code = "not_found" if exc.status_code == 404 else None
        message = f"{request.method} {request.url.path}: {exc.detail}"
        return _error(ApiError(exc.status_code, message, None, code))

    @app.get("/v1/models")
    @app.get("/models")
    async def models() -> JSONResponse:
        card = ModelCard(id=name, max_model_len=service.generator.context_length)
        return JSONResponse(ModelList(data=[card]).model_dump())

    @app.get("/health")
    @app.get("/v1/health")
    async def health() -> JSONResponse:
        state = service.health()
        return JSONResponse(state.model_dump(exclude_none=True), status_code=200 if state.ok else 503)

    @app.get("/metrics")
    @app.get("/v1/metrics")
    async def metrics() -> Response:
        extra = getattr(service.generator, "metrics_text", None)
        body = service.counters.exposition() + (extra().encode() if callable(extra) else b"")
        return Response(body, media_type="text/plain; version=0.0.4")

    @app.post("/tokenize")
    @app.post("/v1/tokenize")
    async def tokenize(request: Request) -> JSONResponse:
        body = await _parse(request, TokenizeRequest)
        if isinstance(body, ApiError):
            return _error(body)
        if body.messages is not None:
            rendered = await service.off_loop(
                service.tokenize_chat, ChatCompletionRequest(messages=body.messages, tools=body.tools)
            )
            if isinstance(rendered, ApiError):
                return _error(rendered)
            ids = rendered
        elif body.prompt is not None:
            ids = await service.off_loop(_encode, service, body.prompt, body.add_special_tokens)
        else:
            return _error(ApiError(400, "give either prompt or messages", "prompt"))
        strs = await service.off_loop(service.generator.token_strs, ids) if body.return_token_strs else None
        answer = TokenizeResponse(
            count=len(ids), max_model_len=service.generator.context_length, tokens=ids, token_strs=strs
        )
        return JSONResponse(answer.model_dump(exclude_none=True))

    @app.post("/detokenize")
    @app.post("/v1/detokenize")
    async def detokenize(request: Request) -> JSONResponse:
        body = await _parse(request, DetokenizeRequest)
        if isinstance(body, ApiError):
            return _error(body)
        bad = service.invalid_token_ids(body.tokens)
        if bad:
            return _error(ApiError(400, bad, "tokens"))
        return JSONResponse(DetokenizeResponse(prompt=service.generator.decode(body.tokens)).model_dump())

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        admitted = await _admit(service, request, ChatCompletionRequest, service.prepare_chat)
        if isinstance(admitted, JSONResponse):
            return admitted
        body, prepared = admitted
        parser = prepared.parser
        if body.stream:
            options = body.stream_options or {}
            usage_chunk = bool(options.get("include_usage"))
            prompt_usage = bool(options.get("continuous_usage_stats"))
            return _stream(_chat_stream(service, prepared, parser, usage_chunk, prompt_usage), pacing)
        try:
            deltas, outcome = await _collect_chat(service, prepared, parser)
        except Exception as exc:
            return _error(_outcome_error(exc))
        finish = "tool_calls" if parser.tool_calls_made and outcome.finish_reason == "stop" else None
        choice = Choice(
            message=_merge(deltas),
            finish_reason=finish or outcome.finish_reason,  # type: ignore[arg-type]
            stop_reason=outcome.stop_reason,
        )
        if body.return_token_ids:
            choice.token_ids = outcome.token_ids  # type: ignore[attr-defined]
        answer = ChatCompletion(
            id=new_id(), model=name, choices=[choice], usage=_usage(outcome), tensorfold=outcome.stats()
        )
        return JSONResponse(answer.model_dump(exclude_none=True))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        admitted = await _admit(service, request, CompletionRequest, service.prepare_completion)
        if isinstance(admitted, JSONResponse):
            return admitted
        body, prepared = admitted
        if body.stream:
            usage_chunk = bool((body.stream_options or {}).get("include_usage"))
            return _stream(_completion_stream(service, prepared, usage_chunk), pacing)
        pieces: list[str] = []
        try:
            async for item in service.run(prepared):
                if isinstance(item, Outcome):
                    outcome = item
                else:
                    pieces.append(item)
        except Exception as exc:
            return _error(_outcome_error(exc))
        choice = CompletionChoice(
            text="".join(pieces),
            finish_reason=outcome.finish_reason,  # type: ignore[arg-type]
            stop_reason=outcome.stop_reason,
        )
        if body.return_token_ids:
            choice.token_ids = outcome.token_ids  # type: ignore[attr-defined]
        answer = Completion(
            id=new_id("cmpl"), model=name, choices=[choice], usage=_usage(outcome), tensorfold=outcome.stats()
        )
        return JSONResponse(answer.model_dump(exclude_none=True))

    return DirectRoutes(app, {"/v1/chat/completions": chat, "/v1/completions": completions})


def _encode(service: EngineService, text: str, add_special_tokens: bool) -> list[int]:
    return service.generator.encode(text, add_special_tokens=add_special_tokens)


def _usage(outcome: Outcome) -> Usage:
    return Usage.of(
        outcome.prompt_tokens,
        len(outcome.token_ids),
        cached=outcome.report.cached_tokens,
        reasoning=outcome.reasoning_tokens,
    )


async def _collect_chat(
    service: EngineService, prepared: Prepared, parser: OutputParser
) -> tuple[list[Delta], Outcome]:
    deltas: list[Delta] = []
    async for item in service.run(prepared):
        if isinstance(item, Outcome):
            deltas += parser.finish(item.finish_reason)
            return deltas, item
        deltas += parser.feed(item)
    raise RuntimeError("the generation ended without an outcome")


def _merge(deltas: list[Delta]) -> ResponseMessage:
    """One assistant message from its deltas (tool-call arguments concatenated per index)."""
    content = "".join(d.content for d in deltas if d.content)
    reasoning = "".join(d.reasoning_content for d in deltas if d.reasoning_content)
    calls: dict[int, dict[str, Any]] = {}
    for delta in deltas:
        for part in delta.tool_calls or []:
            call = calls.setdefault(part.index, {"id": part.id, "name": "", "arguments": ""})
            call["id"] = call["id"] or part.id
            call["name"] += (part.function or {}).get("name") or ""
            call["arguments"] += (part.function or {}).get("arguments") or ""
    tool_calls = [
        ToolCall(id=c["id"] or new_id("call"), function={"name": c["name"], "arguments": c["arguments"]})  # type: ignore[arg-type]
        for _, c in sorted(calls.items())
    ]
    return ResponseMessage(
        content=content or None, reasoning_content=reasoning or None, tool_calls=tool_calls or None
    )


def _error_event(exc: BaseException) -> bytes:
    error = _outcome_error(exc)
    return sse_event(error.body())


async def _chat_stream(
    service: EngineService, prepared: Prepared, parser: OutputParser, usage_chunk: bool, prompt_usage: bool
) -> AsyncIterator[bytes]:
    """The chat SSE; ``prompt_usage`` (``continuous_usage_stats``) puts the prompt's usage on the
    role chunk too, so a translator knows the input tokens before the reply starts."""
    ident, name, created = new_id(), service.served_name, int(time.time())

    def event(choices: list[ChunkChoice], **extra: Any) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=ident, model=name, created=created, choices=choices, **extra)

    def chunk(delta: Delta, finish: str | None = None, **extra: Any) -> bytes:
        choice = ChunkChoice(delta=delta, finish_reason=finish)  # type: ignore[arg-type]
        return sse_event(event([choice], **extra))

    def text_events(delta: Delta) -> TextEvents:
        return TextEvents(event([ChunkChoice(delta=delta)]))

    content = text_events(Delta(content=TextEvents.MARKER))
    reasoning = text_events(Delta(reasoning_content=TextEvents.MARKER))

    def delta_event(delta: Delta) -> bytes:  # a token's text as content or reasoning: the fast path
        if delta.role is None and delta.tool_calls is None:
            if delta.reasoning_content is None and delta.content is not None:
                return content(delta.content)
            if delta.content is None and delta.reasoning_content is not None:
                return reasoning(delta.reasoning_content)
        return chunk(delta)

    opening = Usage.of(len(prepared.prompt_ids), 0) if prompt_usage else None
    yield chunk(Delta(role="assistant", content=""), usage=opening)
    try:
        async for item in service.run(prepared):
            if isinstance(item, Outcome):
                for delta in parser.finish(item.finish_reason):
                    yield chunk(delta)
                finish = "tool_calls" if parser.tool_calls_made and item.finish_reason == "stop" else None
                usage = _usage(item)
                end = ChunkChoice(
                    delta=Delta(),
                    finish_reason=finish or item.finish_reason,  # type: ignore[arg-type]
                    stop_reason=item.stop_reason,
                )
                yield sse_event(event([end], usage=usage, tensorfold=item.stats()))
                if usage_chunk:
                    yield sse_event(event([], usage=usage))
            else:
                for delta in parser.feed(item):
                    yield delta_event(delta)
    except Exception as exc:
        yield _error_event(exc)
    yield SSE_DONE


async def _completion_stream(
    service: EngineService, prepared: Prepared, usage_chunk: bool
) -> AsyncIterator[bytes]:
    ident, name, created = new_id("cmpl"), service.served_name, int(time.time())

    def chunk(text: str, finish: str | None = None, **extra: Any) -> bytes:
        choice = CompletionChoice(text=text, finish_reason=finish)  # type: ignore[arg-type]
        return sse_event(Completion(id=ident, model=name, created=created, choices=[choice], **extra))

    text_event = TextEvents(
        Completion(id=ident, model=name, created=created, choices=[CompletionChoice(text=TextEvents.MARKER)])
    )

    try:
        async for item in service.run(prepared):
            if isinstance(item, Outcome):
                usage = _usage(item)
                end = CompletionChoice(
                    text="",
                    finish_reason=item.finish_reason,  # type: ignore[arg-type]
                    stop_reason=item.stop_reason,
                )
                yield sse_event(
                    Completion(
                        id=ident,
                        model=name,
                        created=created,
                        choices=[end],
                        usage=usage,
                        tensorfold=item.stats(),
                    )
                )
                if usage_chunk:
                    yield sse_event(Completion(id=ident, model=name, choices=[], usage=usage))
            else:
                yield text_event(item)
    except Exception as exc:
        yield _error_event(exc)
    yield SSE_DONE
