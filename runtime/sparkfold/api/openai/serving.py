"""Serving logic of the OpenAI routes; the chat pipeline that the other dialects reuse.

:class:`ChatServing` checks a chat request (limits, reasoning controls, ignored fields), sends
it to the engine and cleans the answer (tool-call hygiene, ``reasoning`` alias). Every method
returns a result or an :class:`~sparkfold.api.errors.ApiError` value; nothing here knows HTTP.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterable, AsyncIterator
from typing import Any

from pydantic import BaseModel

from sparkfold.api.capabilities import Capabilities
from sparkfold.api.chat_stream import DONE, ChatEvent, ChatStream
from sparkfold.api.context import CallContext
from sparkfold.api.errors import ApiError, ClientError, InvalidRequest
from sparkfold.api.lanes import at_the_head
from sparkfold.api.limits import UploadLimits, check_media
from sparkfold.api.metrics import Metrics
from sparkfold.api.model_names import ModelNames
from sparkfold.api.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from sparkfold.api.reasoning import ReasoningControls, resolve_reasoning
from sparkfold.api.tool_results import orphan_result
from sparkfold.api.tools import Toolbox
from sparkfold.api.upstream import Engine
from sparkfold.asgi import EventStream
from sparkfold.protocol import (
    ChatCompletion,
    Completion,
    DetokenizeResponse,
    TokenizeResponse,
    ignored_fields,
    ignored_summary,
)
from sparkfold.sse import KEEPALIVE_COMMENT, SSE_DONE, data_event, sse_event

__all__ = [
    "ChatServing",
    "CompletionServing",
    "PreparedChat",
    "UtilityServing",
    "log_ignored",
    "openai_sse",
    "refuse_unserved",
    "tokenizer_call",
]

log = logging.getLogger(__name__)

# Extra request fields the gateway reads itself (so they are not "ignored").
_CONSUMED = frozenset({"thinking", "reasoning"})


def log_ignored(request: BaseModel, call: CallContext, consumed: frozenset[str] = frozenset()) -> None:
    names = [name for name in ignored_fields(request) if name not in consumed]
    for i, message in enumerate(getattr(request, "messages", None) or []):
        names += [f"messages[{i}].{name}" for name in ignored_fields(message)]
    if names:
        log.info("ignored request fields", extra={"request_id": call.request_id, **ignored_summary(names)})


def _known_fields(request: BaseModel) -> dict[str, Any]:
    """The request as the engine should see it: fields the client set, extras left out."""
    body = request.model_dump(exclude_unset=True, exclude_none=True)
    for name in ignored_fields(request):
        body.pop(name, None)
    if isinstance(request, ChatCompletionRequest):
        for message, dumped in zip(request.messages, body["messages"], strict=True):
            for name in message.model_extra or ():
                dumped.pop(name, None)
    return body


PRIORITIES = {None: 0, "normal": 0, "background": 1}
"""``priority`` values and their place in the gateway's queue (1 waits behind every 0)."""


def check_priority(value: Any) -> ClientError | None:
    if value in PRIORITIES:
        return None
    return InvalidRequest(f'priority must be "normal" or "background"; got {value!r}', param="priority")


def refuse_unserved(request: ChatCompletionRequest) -> ClientError | None:
    """OpenAI chat fields that, ignored as other unknown fields are, would lose what the client
    asked for without a word: the deprecated ``functions`` (no call would ever come back) and
    audio output (``modalities`` with ``"audio"``, ``audio``): a 400 saying what to send instead."""
    extra = request.model_extra or {}
    if "functions" in extra or "function_call" in extra:
        return InvalidRequest(
            'functions and function_call are OpenAI\'s deprecated spelling of tools: send tools=[{"type": '
            '"function", "function": {...}}] and tool_choice',
            param="functions" if "functions" in extra else "function_call",
        )
    modalities = extra.get("modalities")
    if "audio" in extra or (isinstance(modalities, list) and modalities != ["text"]):
        return InvalidRequest(
            'this server answers text only: leave out audio, and modalities other than ["text"]',
            param="modalities" if modalities is not None else "audio",
        )
    return None


def _resolve_reasoning(request: BaseModel, body: dict[str, Any]) -> ReasoningControls | ClientError:
    """``body``'s reasoning switches as the engine reads them, from every spelling ``request`` used
    (its ``thinking`` and ``reasoning`` extras too): the same for a reply and for a count."""
    extra = request.model_extra or {}
    return resolve_reasoning(body, thinking=extra.get("thinking"), reasoning=extra.get("reasoning"))


def _include_usage(body: dict[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, dict) and bool(options.get("include_usage"))


def _first_token_hook(metrics: Metrics, call: CallContext) -> Any:
    return lambda: metrics.ttft.labels(call.route).observe(time.perf_counter() - call.started)


class PreparedChat:
    """A checked chat request: the engine body and the offered tools."""

    __slots__ = ("body", "toolbox")

    def __init__(self, body: dict[str, Any], toolbox: Toolbox) -> None:
        self.body = body
        self.toolbox = toolbox


class ChatServing:
    """``POST /v1/chat/completions``, and the pipeline under Messages and Responses."""

    def __init__(
        self,
        *,
        engine: Engine,
        capabilities: Capabilities,
        metrics: Metrics,
        limits: UploadLimits,
        keepalive_s: float,
        served_name: str,
        names: ModelNames | None = None,
    ) -> None:
        self.engine = engine
        self.capabilities = capabilities
        self.metrics = metrics
        self.limits = limits
        self.keepalive_s = keepalive_s
        self.served_name = served_name
        self.names = names or ModelNames(served_name)

    def prepare(self, request: ChatCompletionRequest, call: CallContext) -> PreparedChat | ClientError:
        error = check_priority(request.priority) or check_media(request.messages, self.limits)
        if error is not None:
            return error
        body = _known_fields(request)
        orphan = orphan_result(body["messages"])
        if orphan is not None:
            where = f"messages[{orphan[0]}].tool_call_id"
            return InvalidRequest(
                f"{where}: {orphan[1]!r} is the id of no tool call of an earlier assistant message; "
                "a tool message answers one of the tool_calls the conversation made",
                param=where,
            )
        controls = _resolve_reasoning(request, body)
        if isinstance(controls, ClientError):
            return controls
        log_ignored(request, call, _CONSUMED)
        body.setdefault("model", self.served_name)
        self.names.to_engine(body)
        if controls.budget is not None and "thinking_budget" not in body:
            body["thinking_budget"] = controls.budget
        return PreparedChat(body, Toolbox(request.tools))

    async def complete(self, prepared: PreparedChat, call: CallContext) -> dict[str, Any] | ApiError:
        """The whole reply at once, cleaned (after a lane is taken for ``call``)."""
        refused = await call.admit(PRIORITIES[prepared.body.get("priority")])
        if refused is not None:
            return refused
        body = {**prepared.body, "stream": False}
        path, timeout_s = "/v1/chat/completions", self.engine.reply_timeout_s
        try:
            reply = await at_the_head(
                lambda: self.engine.post_reply(path, body, ChatCompletion, timeout_s=timeout_s)
            )
        except ApiError as error:
            self._count_error(error)
            return error
        result = reply.model_dump(mode="json", exclude_unset=True)  # the engine's JSON, checked
        for choice in result["choices"]:
            prepared.toolbox.clean_message(choice)
            message = choice["message"]
            if message.get("reasoning_content") is not None:
                message["reasoning"] = message["reasoning_content"]
        self.metrics.count_usage(result["usage"])
        return result

    async def open(self, prepared: PreparedChat, call: CallContext) -> ChatStream | ApiError:
        """Open the engine stream (after a lane is taken for ``call``); refusals come back as
        errors before anything is sent."""
        refused = await call.admit(PRIORITIES[prepared.body.get("priority")])
        if refused is not None:
            return refused
        body = {**prepared.body, "stream": True}
        try:
            upstream = await at_the_head(lambda: self.engine.open_stream("/v1/chat/completions", body))
        except ApiError as error:
            self._count_error(error)
            return error
        return ChatStream(
            upstream,
            keepalive_s=self.keepalive_s,
            toolbox=prepared.toolbox,
            on_first_token=_first_token_hook(self.metrics, call),
            on_usage=self.metrics.count_usage,
            include_usage=_include_usage(prepared.body),
        )

    async def create(
        self, request: ChatCompletionRequest, call: CallContext
    ) -> dict[str, Any] | ApiError | EventStream:
        prepared = refuse_unserved(request) or self.prepare(request, call)
        if isinstance(prepared, ApiError):
            return prepared
        refused = await self.capabilities.refuse_unsupported(
            n=request.n, logprobs=request.logprobs, top_logprobs=request.top_logprobs
        )
        if refused is not None:
            return refused
        if not request.stream:
            return await self.complete(prepared, call)
        stream = await self.open(prepared, call)
        if isinstance(stream, ApiError):
            return stream
        return EventStream(openai_sse(stream), stream.aclose, self.metrics.cancelled.inc)

    def _count_error(self, error: ApiError) -> None:
        if not isinstance(error, ClientError):
            self.metrics.upstream_errors.inc()


async def openai_sse(batches: AsyncIterable[list[ChatEvent]]) -> AsyncIterator[bytes]:
    """Chat events as OpenAI SSE bytes, one write per batch."""
    async for batch in batches:
        out = []
        for event in batch:
            if isinstance(event, bytes):
                out.append(data_event(event))
            elif isinstance(event, dict):
                out.append(sse_event(event))
            elif event is None:
                out.append(KEEPALIVE_COMMENT)
            elif event is DONE:
                out.append(SSE_DONE)
        yield b"".join(out)


class CompletionServing:
    """``POST /v1/completions``: a raw prompt, relayed with the same limits and stream handling."""

    def __init__(
        self,
        *,
        engine: Engine,
        capabilities: Capabilities,
        metrics: Metrics,
        keepalive_s: float,
        served_name: str,
        names: ModelNames | None = None,
    ) -> None:
        self.engine = engine
        self.capabilities = capabilities
        self.metrics = metrics
        self.keepalive_s = keepalive_s
        self.served_name = served_name
        self.names = names or ModelNames(served_name)

    async def create(
        self, request: CompletionRequest, call: CallContext
    ) -> dict[str, Any] | ApiError | EventStream:
        prompts = (
            len(request.prompt)
            if isinstance(request.prompt, list) and isinstance(request.prompt[0], (str, list))
            else 1
        )
        error = await self.capabilities.refuse_unsupported(
            n=request.n, logprobs=request.logprobs, top_logprobs=None, prompts=prompts
        )
        if error is not None:
            return error
        log_ignored(request, call)
        body = self.names.to_engine(_known_fields(request))
        body.setdefault("model", self.served_name)
        refused = await call.admit(0)
        if refused is not None:
            return refused
        try:
            if not request.stream:
                timeout_s = self.engine.reply_timeout_s
                reply = await at_the_head(
                    lambda: self.engine.post_reply("/v1/completions", body, Completion, timeout_s=timeout_s)
                )
                result = reply.model_dump(mode="json", exclude_unset=True)
                self.metrics.count_usage(result.get("usage"))
                return result
            upstream = await at_the_head(lambda: self.engine.open_stream("/v1/completions", body))
        except ApiError as failure:
            if not isinstance(failure, ClientError):
                self.metrics.upstream_errors.inc()
            return failure
        stream = ChatStream(
            upstream,
            keepalive_s=self.keepalive_s,
            toolbox=Toolbox(None),
            chunk_model=Completion,
            on_first_token=_first_token_hook(self.metrics, call),
            on_usage=self.metrics.count_usage,
            include_usage=_include_usage(body),
        )
        return EventStream(openai_sse(stream), stream.aclose, self.metrics.cancelled.inc)


class UtilityServing:
    """The tokenizer routes: checked, then answered by the engine (the model routes:
    :class:`~sparkfold.api.models.ModelsServing`)."""

    def __init__(self, *, engine: Engine, names: ModelNames, limits: UploadLimits | None = None) -> None:
        self.engine = engine
        self.limits = limits
        self.names = names

    async def tokenize(self, request: TokenizeRequest, call: CallContext) -> dict[str, Any] | ApiError:
        if (request.prompt is None) == (request.messages is None):
            return ClientError("give exactly one of prompt or messages", param="prompt")
        if request.messages is not None and self.limits is not None:  # bounded like a generating request
            refused = check_media(request.messages, self.limits)
            if refused is not None:
                return refused
        body = self.names.to_engine(_known_fields(request))
        controls = _resolve_reasoning(request, body)  # the prompt renders as the reply's would
        if isinstance(controls, ClientError):
            return controls
        log_ignored(request, call, _CONSUMED)
        return await tokenizer_call(self.engine, call, "/tokenize", body, TokenizeResponse)

    async def detokenize(self, request: DetokenizeRequest, call: CallContext) -> dict[str, Any] | ApiError:
        log_ignored(request, call)
        return await tokenizer_call(
            self.engine, call, "/detokenize", _known_fields(request), DetokenizeResponse
        )


async def tokenizer_call(
    engine: Engine, call: CallContext, path: str, body: dict[str, Any], model: type[BaseModel]
) -> dict[str, Any] | ApiError:
    """A tokenizer route's engine call, in one of the tokenizer's own lanes (``call.admit``: see
    :data:`~sparkfold.api.lanes.TOKENIZER_LANES`), its answer typed as ``model``."""
    refused = await call.admit(0)
    if refused is not None:
        return refused
    try:
        answer = await engine.post_reply(path, body, model)
    except ApiError as error:
        return error
    return answer.model_dump(mode="json", exclude_unset=True)
