"""Serving of `/v1/messages` and `/v1/messages/count_tokens`: translate, reuse chat, translate back."""

from __future__ import annotations

import logging
from typing import Any

from sparkfold.api.anthropic.context import log_unapplied_edits
from sparkfold.api.anthropic.protocol import CountTokensRequest, MessagesRequest
from sparkfold.api.anthropic.stream import anthropic_sse
from sparkfold.api.anthropic.translate import (
    chat_tools,
    from_chat,
    omits_thinking,
    prompt_of,
    reasoning_fields,
    redacted_blocks,
    to_chat,
)
from sparkfold.api.context import CallContext
from sparkfold.api.errors import ApiError, InvalidRequest
from sparkfold.api.ignored_tools import say_ignored_tools
from sparkfold.api.openai.serving import ChatServing, log_ignored, tokenizer_call
from sparkfold.api.reasoning import resolve_reasoning
from sparkfold.api.sealed import ReasoningSeal
from sparkfold.api.upstream import Engine
from sparkfold.asgi import EventStream
from sparkfold.protocol import TokenizeResponse, ignored_summary

__all__ = ["MessagesServing"]

log = logging.getLogger(__name__)


def _log_dropped(request: MessagesRequest | CountTokensRequest, call: CallContext) -> None:
    """Ignored fields, context edits and tools, and the ``redacted_thinking`` blocks the
    translation drops, by place."""
    log_ignored(request, call)
    log_unapplied_edits(request.context_management, call)
    tools = chat_tools(request)
    if not isinstance(tools, InvalidRequest):
        say_ignored_tools(tools[1], call)
    dropped = redacted_blocks(request)
    if dropped:
        log.info(
            "dropped redacted_thinking blocks",
            extra={"request_id": call.request_id, **ignored_summary(dropped)},
        )


class MessagesServing:
    def __init__(self, *, chat: ChatServing, engine: Engine, seal: ReasoningSeal | None = None) -> None:
        self.chat = chat
        self.engine = engine
        self.seal = seal or ReasoningSeal()

    async def create(
        self, request: MessagesRequest, call: CallContext
    ) -> dict[str, Any] | ApiError | EventStream:
        _log_dropped(request, call)
        chat_request = to_chat(request, self.seal)
        if isinstance(chat_request, ApiError):
            return chat_request
        prepared = self.chat.prepare(chat_request, call)
        if isinstance(prepared, ApiError):
            return prepared
        if not request.stream:
            result = await self.chat.complete(prepared, call)
            if isinstance(result, ApiError):
                return result
            return from_chat(
                result,
                model=request.model,
                stop_sequences=request.stop_sequences,
                seal=self.seal,
                omit_thinking=omits_thinking(request),
            )
        stream = await self.chat.open(prepared, call)
        if isinstance(stream, ApiError):
            return stream

        async def count_input() -> int | None:
            """The prompt's tokens, for an engine whose first chunk has none (TensorFold): its
            ``/tokenize``, inside the lane this stream already holds; None if it cannot say."""
            body = _tokenize_body(request, self.seal)
            if isinstance(body, InvalidRequest):
                return None
            try:
                answer = await self.engine.post_reply("/tokenize", body, TokenizeResponse)
            except ApiError:
                return None
            return answer.count

        events = anthropic_sse(
            stream,
            model=request.model,
            stop_sequences=request.stop_sequences,
            count_input=count_input,
            seal=self.seal,
            omit_thinking=omits_thinking(request),
        )
        return EventStream(events, stream.aclose, self.chat.metrics.cancelled.inc)

    async def count_tokens(self, request: CountTokensRequest, call: CallContext) -> dict[str, Any] | ApiError:
        _log_dropped(request, call)
        body = _tokenize_body(request, self.seal)
        if isinstance(body, InvalidRequest):
            return body
        result = await tokenizer_call(self.engine, call, "/tokenize", body, TokenizeResponse)
        if isinstance(result, ApiError):
            return result
        return {"input_tokens": result["count"]}


def _tokenize_body(
    request: MessagesRequest | CountTokensRequest, seal: ReasoningSeal
) -> dict[str, Any] | InvalidRequest:
    """The engine ``/tokenize`` body that counts the request's prompt (tools included when shown)."""
    prompt = prompt_of(request, seal)
    if isinstance(prompt, InvalidRequest):
        return prompt
    messages, tools = prompt
    body: dict[str, Any] = {"messages": messages, **reasoning_fields(request)}
    if tools and (request.tool_choice or {}).get("type") != "none":
        body["tools"] = tools  # the prompt shows them: they count
    switches = resolve_reasoning(body, thinking=body.pop("thinking", None))  # as the reply renders
    return switches if isinstance(switches, InvalidRequest) else body
