"""Serving logic of ``/v1/responses``: run as a chat completion, store the result when asked."""

from __future__ import annotations

import logging
from typing import Any

from sparkfold.api.context import CallContext
from sparkfold.api.errors import ApiError, NotFound
from sparkfold.api.ignored_tools import say_ignored_tools
from sparkfold.api.openai.serving import ChatServing, log_ignored
from sparkfold.api.responses.protocol import ResponsesRequest
from sparkfold.api.responses.store import ResponseStore
from sparkfold.api.responses.stream import responses_sse
from sparkfold.api.responses.tools import ResponsesTools, responses_tools
from sparkfold.api.responses.translate import instructions_of, output_items, response_object, to_chat
from sparkfold.api.sealed import ReasoningSeal
from sparkfold.asgi import EventStream
from sparkfold.protocol import new_id
from sparkfold.units import MIB

__all__ = ["ResponsesServing"]

log = logging.getLogger(__name__)

ENCRYPTED_REASONING = "reasoning.encrypted_content"


def _say_ignored(tools: ResponsesTools, request: ResponsesRequest, call: CallContext) -> None:
    """The tools not offered (header and log), the custom tools' grammars not enforced, and the
    reasoning fields this server cannot honour."""
    say_ignored_tools(tools.ignored, call)
    if tools.unenforced:
        log.info(
            "custom tools' lark grammars shown to the model, not enforced",
            extra={"request_id": call.request_id, "tools": tools.unenforced},
        )
    summary = (request.reasoning or {}).get("summary")
    if summary is not None:  # the reasoning itself is returned (reasoning_text), never a summary
        log.info(
            "ignored request fields", extra={"request_id": call.request_id, "fields": ["reasoning.summary"]}
        )


class ResponsesServing:
    def __init__(self, *, chat: ChatServing, store: ResponseStore, seal: ReasoningSeal | None = None) -> None:
        self.chat = chat
        self.store = store
        self.seal = seal or ReasoningSeal()

    async def create(
        self, request: ResponsesRequest, call: CallContext
    ) -> dict[str, Any] | ApiError | EventStream:
        log_ignored(request, call, frozenset({"reasoning"}))
        history: list[dict[str, Any]] = []
        if request.previous_response_id is not None:
            found = self.store.conversation(request.previous_response_id, tenant=call.tenant)
            if found is None:
                return self._missing(request.previous_response_id, call, "previous_response_id")
            history = found
        tools = responses_tools(request.tools, request.input)
        if isinstance(tools, ApiError):
            return tools
        _say_ignored(tools, request, call)
        chat_request = to_chat(request, history, tools=tools, seal=self.seal)
        if isinstance(chat_request, ApiError):
            return chat_request
        seal = self.seal if ENCRYPTED_REASONING in (request.include or ()) else None
        prepared = self.chat.prepare(chat_request, call)
        if isinstance(prepared, ApiError):
            return prepared
        response_id = new_id("resp")
        model = request.model or self.chat.served_name
        # what a continuation builds on: the messages less this request's instructions (not carried over)
        conversation = prepared.body["messages"][len(instructions_of(request)) :]

        def keep(response: dict[str, Any], reply: dict[str, Any]) -> None:
            if request.store:
                self.store.put(response, [*conversation, reply], tenant=call.tenant)

        if not request.stream:
            result = await self.chat.complete(prepared, call)
            if isinstance(result, ApiError):
                return result
            choice = (result.get("choices") or [{}])[0]
            message = choice.get("message") or {}
            finish = choice.get("finish_reason")
            response = response_object(
                request,
                response_id=response_id,
                model=model,
                output=output_items(message, finish, tools=tools, seal=seal),
                usage=result.get("usage"),
                status="incomplete" if finish == "length" else "completed",
                finish_reason=finish,
            )
            kept = ("role", "content", "reasoning_content", "tool_calls")  # as the stream keeps them
            keep(response, {k: v for k, v in message.items() if k in kept and v is not None})
            return response
        stream = await self.chat.open(prepared, call)
        if isinstance(stream, ApiError):
            return stream

        def skeleton(
            status: str, output: list[dict[str, Any]], usage: Any, finish: str | None
        ) -> dict[str, Any]:
            return response_object(
                request,
                response_id=response_id,
                model=model,
                output=output,
                usage=usage,
                status=status,
                finish_reason=finish,
            )

        events = responses_sse(stream, skeleton=skeleton, on_done=keep, tools=tools, seal=seal)
        return EventStream(events, stream.aclose, self.chat.metrics.cancelled.inc)

    def get(self, response_id: str, call: CallContext) -> dict[str, Any] | ApiError:
        found = self.store.get(response_id, tenant=call.tenant)
        return found if found is not None else self._missing(response_id, call, "response_id")

    def delete(self, response_id: str, call: CallContext) -> dict[str, Any] | ApiError:
        if not self.store.delete(response_id, tenant=call.tenant):
            return self._missing(response_id, call, "response_id")
        return {"id": response_id, "object": "response", "deleted": True}

    def _missing(self, response_id: str, call: CallContext, param: str) -> NotFound:
        """404 for a response this key cannot find, saying why when it was too large to keep."""
        size = self.store.refused(response_id, tenant=call.tenant)
        why = (
            f"it was answered but not stored: {size / MIB:.1f} MiB with its conversation, past "
            "api.max_stored_response_mib; send the whole conversation as input instead"
            if size is not None
            else "it expired, was deleted or was never stored"
        )
        return NotFound(f"no stored response {response_id!r} ({why})", param=param)
