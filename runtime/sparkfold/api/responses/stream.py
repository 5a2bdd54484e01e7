"""Chat events as Responses stream events (``response.created`` ... ``response.completed``, or
``response.incomplete`` for a reply cut by ``max_output_tokens``).

Reasoning, the message text and each function call are output items: ``output_item.added``,
their deltas (``reasoning_text.delta``, ``output_text.delta``, ``function_call_arguments.delta``),
their ``.done`` events and ``output_item.done``. A custom tool's call (``custom_tool_call``) sends
its whole ``input`` in one ``custom_tool_call_input.delta`` when the call is complete: the model
writes it as the argument of a function (:mod:`sparkfold.api.responses.tools`), read once whole.
Silence becomes an SSE comment; an engine error becomes ``response.failed``. The finished
response is handed to ``on_done`` (the store).
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator, Callable
from typing import Any

from sparkfold.api.chat_stream import DONE, ChatEvent, as_chunk, choices_of, each_event, is_text
from sparkfold.api.responses.tools import ResponsesTools, custom_input
from sparkfold.api.responses.translate import (
    call_arguments,
    call_item,
    custom_call_item,
    message_item,
    reasoning_item,
)
from sparkfold.api.sealed import ReasoningSeal
from sparkfold.protocol import new_id
from sparkfold.sse import KEEPALIVE_COMMENT, named_event

DELTA_EVENTS = {"reasoning": "response.reasoning_text.delta", "message": "response.output_text.delta"}

__all__ = ["responses_sse"]


def _new_reasoning() -> dict[str, Any]:
    return {"type": "reasoning", "id": new_id("rs"), "summary": []}


def _new_message() -> dict[str, Any]:
    return message_item(new_id("msg"), "", status="in_progress")


class _Emitter:
    def __init__(self) -> None:
        self.sequence = 0

    def __call__(self, name: str, data: dict[str, Any]) -> bytes:
        body = {"type": name, "sequence_number": self.sequence, **data}
        self.sequence += 1
        return named_event(name, body)


class _Item:
    def __init__(self, kind: str, index: int, item: dict[str, Any]) -> None:
        self.kind = kind
        self.index = index
        self.item = item
        self.text = ""
        self.offered = ""  # a function call's name as the model wrote it (what a continuation sends)


async def responses_sse(
    batches: AsyncIterable[list[ChatEvent]],
    *,
    skeleton: Callable[[str, list[dict[str, Any]], dict[str, Any] | None, str | None], dict[str, Any]],
    on_done: Callable[[dict[str, Any], dict[str, Any]], None],
    tools: ResponsesTools | None = None,
    seal: ReasoningSeal | None = None,
) -> AsyncIterator[bytes]:
    """``skeleton(status, output, usage, finish_reason)`` builds the response object at each stage;
    ``on_done(response, reply_message)`` receives the finished one; ``tools`` names function calls
    back (their namespace), ``seal`` (when given) seals each reasoning item's text."""
    tools = tools or ResponsesTools()
    emit = _Emitter()
    output: list[dict[str, Any]] = []
    current: _Item | None = None
    usage: dict[str, Any] | None = None
    finish: str | None = None
    reply: dict[str, Any] = {"role": "assistant", "content": ""}
    yield emit("response.created", {"response": skeleton("in_progress", [], None, None)})
    yield emit("response.in_progress", {"response": skeleton("in_progress", [], None, None)})

    def close() -> list[bytes]:
        nonlocal current
        if current is None:
            return []
        item, out = current, []
        if item.kind == "reasoning":
            item.item = reasoning_item(item.item["id"], item.text, seal)
            out.append(
                emit(
                    "response.reasoning_text.done",
                    {
                        "item_id": item.item["id"],
                        "output_index": item.index,
                        "content_index": 0,
                        "text": item.text,
                    },
                )
            )
        elif item.kind in ("function_call", "custom_tool_call"):
            base = {"item_id": item.item["id"], "output_index": item.index}
            arguments, status = call_arguments(item.text, finish)
            if item.kind == "custom_tool_call":
                text = custom_input(arguments)
                if text:
                    out.append(emit("response.custom_tool_call_input.delta", {**base, "delta": text}))
                out.append(emit("response.custom_tool_call_input.done", {**base, "input": text}))
                item.item = {**item.item, "input": text, "status": status}
            else:
                done = {**base, "name": item.item["name"], "arguments": arguments}
                out.append(emit("response.function_call_arguments.done", done))
                item.item = {**item.item, "arguments": arguments, "status": status}
            reply.setdefault("tool_calls", []).append(
                {
                    "id": item.item["call_id"],
                    "type": "function",
                    "function": {"name": item.offered, "arguments": arguments},
                }
            )
        elif item.kind == "message":
            part = {"type": "output_text", "text": item.text, "annotations": []}
            base = {"item_id": item.item["id"], "output_index": item.index, "content_index": 0}
            out.append(emit("response.output_text.done", {**base, "text": item.text, "logprobs": []}))
            out.append(emit("response.content_part.done", {**base, "part": part}))
            item.item = message_item(item.item["id"], item.text)
        output.append(item.item)
        out.append(emit("response.output_item.done", {"output_index": item.index, "item": item.item}))
        current = None
        return out

    def open_item(kind: str, item: dict[str, Any]) -> list[bytes]:
        nonlocal current
        out = close()
        current = _Item(kind, len(output), item)
        out.append(emit("response.output_item.added", {"output_index": current.index, "item": item}))
        if kind == "message":
            part = {"type": "output_text", "text": "", "annotations": []}
            out.append(
                emit(
                    "response.content_part.added",
                    {"item_id": item["id"], "output_index": current.index, "content_index": 0, "part": part},
                )
            )
        return out

    def add_text(kind: str, opened: Callable[[], dict[str, Any]], text: str) -> list[bytes]:
        """``text`` onto the open item of ``kind`` (a new one, ``opened()``, closes any other); its delta."""
        out = [] if current is not None and current.kind == kind else open_item(kind, opened())
        assert current is not None
        current.text += text
        where = {"item_id": current.item["id"], "output_index": current.index, "content_index": 0}
        logprobs: dict[str, Any] = {"logprobs": []} if kind == "message" else {}  # output_text needs it
        out.append(emit(DELTA_EVENTS[kind], {**where, "delta": text, **logprobs}))
        return out

    async for event in each_event(batches):
        if event is None:
            yield KEEPALIVE_COMMENT
            continue
        if event is DONE:
            break
        chunk = as_chunk(event)  # type: ignore[arg-type]
        if "error" in chunk:
            for out in close():
                yield out
            info = chunk["error"] if isinstance(chunk["error"], dict) else {"message": str(chunk["error"])}
            failed = skeleton("failed", output, usage, None)
            failed["error"] = {"code": "server_error", "message": str(info.get("message"))}
            yield emit("response.failed", {"response": failed})
            return
        if isinstance(chunk.get("usage"), dict):
            usage = chunk["usage"]
        for choice, delta in choices_of(chunk):
            if is_text(delta.get("reasoning_content")):
                for out in add_text("reasoning", _new_reasoning, delta["reasoning_content"]):
                    yield out
                assert current is not None
                reply["reasoning_content"] = current.text
            if is_text(delta.get("content")):
                for out in add_text("message", _new_message, delta["content"]):
                    yield out
                reply["content"] += delta["content"]
            for call in (
                delta.get("tool_calls") or []
            ):  # a call's first delta names it; the rest add arguments
                function = call.get("function") or {}
                if function.get("name"):
                    call_id = call.get("id") or new_id("call")
                    names = tools.call_fields(function["name"])
                    if tools.is_custom(function["name"]):
                        kind, item = "custom_tool_call", custom_call_item(new_id("ctc"), call_id, names, "")
                    else:
                        kind, item = "function_call", call_item(new_id("fc"), call_id, names, "")
                    for out in open_item(kind, {**item, "status": "in_progress"}):
                        yield out
                    assert current is not None
                    current.offered = function["name"]
                if current is None or current.kind not in ("function_call", "custom_tool_call"):
                    continue  # arguments of no open call: nothing to attach them to
                piece = function.get("arguments") or ""
                if piece:
                    current.text += piece
                    if current.kind == "custom_tool_call":
                        continue  # sent whole when the call closes
                    base = {"item_id": current.item["id"], "output_index": current.index}
                    yield emit("response.function_call_arguments.delta", {**base, "delta": piece})
            if choice.get("finish_reason"):
                finish = choice["finish_reason"]
    for out in close():
        yield out
    status = "incomplete" if finish == "length" else "completed"
    done = skeleton(status, output, usage, finish)
    on_done(done, reply)
    # the terminal event is named for the status, as OpenAI's is (openai SDK:
    # types/responses/response_incomplete_event.py): a reply cut by max_output_tokens ends with
    # response.incomplete, whose response says incomplete_details.reason
    yield emit(f"response.{status}", {"response": done})
