"""Responses request -> chat request, and chat completion -> Responses object."""

from __future__ import annotations

import json
import time
from typing import Any

from pydantic import ValidationError

from sparkfold.api.errors import InvalidRequest, untranslatable
from sparkfold.api.responses.protocol import INCLUDE_VALUES, ResponsesRequest
from sparkfold.api.responses.tools import ResponsesTools, custom_arguments, custom_input, offered_name
from sparkfold.api.sealed import ReasoningSeal
from sparkfold.api.tool_results import orphan_result
from sparkfold.protocol import ChatCompletionRequest, new_id

__all__ = [
    "call_item",
    "custom_call_item",
    "instructions_of",
    "message_item",
    "output_items",
    "reasoning_item",
    "response_object",
    "to_chat",
    "to_chat_messages",
]

CALL_OUTPUTS = ("function_call_output", "custom_tool_call_output")


def _content(content: Any, where: str) -> str | list[dict[str, Any]] | InvalidRequest:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return InvalidRequest(f"{where} must be a string or a list of content parts", param=where)
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
            parts.append({"type": "text", "text": part["text"]})
        elif kind == "input_image" and isinstance(part.get("image_url"), str):
            parts.append({"type": "image_url", "image_url": {"url": part["image_url"]}})
        else:
            return InvalidRequest(
                f"{where}[{j}]: unsupported content part (type {kind!r}); use input_text or input_image",
                param=f"{where}[{j}]",
            )
    return parts


def _reasoning_text(item: dict[str, Any], seal: ReasoningSeal, where: str) -> str | InvalidRequest:
    """The text of a ``reasoning`` input item: its ``encrypted_content`` (see
    :mod:`sparkfold.api.sealed`; one from an earlier gateway start gives none), else its
    ``reasoning_text`` parts, else its summary."""
    if item.get("encrypted_content") is not None:
        opened = seal.open(item["encrypted_content"], f"{where}.encrypted_content")
        return opened if opened is not None else ""
    for key, kind in (("content", "reasoning_text"), ("summary", "summary_text")):
        parts = item.get(key)
        texts = [
            p["text"]
            for p in parts or []
            if isinstance(p, dict) and p.get("type") == kind and isinstance(p.get("text"), str)
        ]
        if texts:
            return "".join(texts)
    return ""


def _call_output(output: Any, where: str) -> tuple[str, list[dict[str, Any]]] | InvalidRequest:
    """A ``function_call_output``'s ``output`` (a string, or input_text / input_image parts): the
    tool message's text and the pictures that ride with the next user message (as Anthropic's
    tool results do)."""
    if isinstance(output, str):
        return output, []
    parts = _content(output, where)
    if isinstance(parts, InvalidRequest):
        return parts
    if isinstance(parts, str):
        return parts, []
    texts = [p["text"] for p in parts if p["type"] == "text"]
    return "\n".join(texts), [p for p in parts if p["type"] != "text"]


def instructions_of(request: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's ``instructions`` as the system message that opens the prompt. They are never
    stored with the conversation: OpenAI does not carry them over to a continuation
    (``previous_response_id``), so each request's own come first."""
    return [{"role": "system", "content": request.instructions}] if request.instructions else []


def to_chat_messages(request: ResponsesRequest, seal: ReasoningSeal) -> list[dict[str, Any]] | InvalidRequest:
    """The input items as chat messages (``instructions`` apart: :func:`instructions_of`). A reply's
    items sent back (``reasoning``, ``message``, ``function_call``: what a stateless client echoes)
    become one assistant turn, its reasoning as ``reasoning_content`` (GLM's template shows it for
    the turns after the last user message, the steps of a tool loop, and drops it before). A
    ``custom_tool_call`` is the function call it was offered as, its output a tool message; an
    ``additional_tools`` item adds tools only (:func:`~sparkfold.api.responses.tools.responses_tools`)."""
    messages: list[dict[str, Any]] = []
    if isinstance(request.input, str):
        return [{"role": "user", "content": request.input}]
    reasoning = ""  # of the assistant turn that comes next
    pictures: list[dict[str, Any]] = []  # from function outputs, sent after the tool messages

    def assistant_turn() -> dict[str, Any]:
        """The assistant turn the current item belongs to: the last message if it is one, else new."""
        nonlocal reasoning
        if not messages or messages[-1]["role"] != "assistant" or reasoning:
            messages.append({"role": "assistant", "content": ""})
        if reasoning:
            messages[-1]["reasoning_content"] = reasoning
            reasoning = ""
        return messages[-1]

    for i, item in enumerate(request.input):
        where = f"input[{i}]"
        kind = item.get("type", "message")
        if pictures and kind not in CALL_OUTPUTS:
            messages.append({"role": "user", "content": pictures})
            pictures = []
        if kind == "message" and item.get("role") in ("user", "system", "developer", "assistant"):
            content = _content(item.get("content", ""), f"{where}.content")
            if isinstance(content, InvalidRequest):
                return content
            if item["role"] == "assistant":
                turn = assistant_turn()
                text = content if isinstance(content, str) else "".join(p.get("text", "") for p in content)
                turn["content"] += text
            else:
                reasoning = ""
                messages.append({"role": item["role"], "content": content})
        elif kind in ("function_call", "custom_tool_call") and isinstance(item.get("name"), str):
            arguments = (
                str(item.get("arguments") or "{}")
                if kind == "function_call"
                else custom_arguments(str(item.get("input") or ""))
            )
            call = {
                "id": str(item.get("call_id") or item.get("id") or new_id("call")),
                "type": "function",
                "function": {
                    "name": offered_name(item["name"], item.get("namespace")),
                    "arguments": arguments,
                },
            }
            assistant_turn().setdefault("tool_calls", []).append(call)
        elif kind in CALL_OUTPUTS and isinstance(item.get("call_id"), str):
            output = _call_output(item.get("output", ""), f"{where}.output")
            if isinstance(output, InvalidRequest):
                return output
            text, carried = output
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": text})
            pictures += carried
        elif kind == "additional_tools":
            continue
        elif kind == "reasoning":
            thought = _reasoning_text(item, seal, where)
            if isinstance(thought, InvalidRequest):
                return thought
            reasoning += thought
        else:
            return InvalidRequest(
                f"{where}: unsupported input item (type {kind!r}); use message, function_call, "
                "function_call_output, custom_tool_call, custom_tool_call_output, reasoning or "
                "additional_tools",
                param=where,
            )
    if pictures:
        messages.append({"role": "user", "content": pictures})
    return messages


def to_chat(
    request: ResponsesRequest, history: list[dict[str, Any]], *, tools: ResponsesTools, seal: ReasoningSeal
) -> ChatCompletionRequest | InvalidRequest:
    """The chat request of ``request`` after ``history`` (a stored conversation), offering ``tools``
    (:func:`~sparkfold.api.responses.tools.responses_tools` of its ``tools``)."""
    if request.include is not None:
        unknown = [value for value in request.include if value not in INCLUDE_VALUES]
        if unknown:
            return InvalidRequest(f"include has unknown value {unknown[0]!r}", param="include")
    messages = to_chat_messages(request, seal)
    if isinstance(messages, InvalidRequest):
        return messages
    orphan = orphan_result(history + messages)
    if orphan is not None:
        return InvalidRequest(
            f"no function call found for the function_call_output with call_id {orphan[1]!r}: a "
            "function_call_output answers a function_call of the input or of the previous response",
            param="input",
        )
    fields: dict[str, Any] = {
        "messages": instructions_of(request) + history + messages,
        "stream": request.stream,
    }
    if request.stream:
        fields["stream_options"] = {"include_usage": True}
    if request.model is not None:
        fields["model"] = request.model
    if request.max_output_tokens is not None:
        fields["max_tokens"] = request.max_output_tokens
    for name in ("temperature", "top_p", "parallel_tool_calls"):
        if getattr(request, name) is not None:
            fields[name] = getattr(request, name)
    if tools.chat is not None:
        fields["tools"] = tools.chat
    if isinstance(request.tool_choice, str):
        fields["tool_choice"] = request.tool_choice
    elif isinstance(request.tool_choice, dict) and isinstance(request.tool_choice.get("name"), str):
        name = offered_name(request.tool_choice["name"], request.tool_choice.get("namespace"))
        fields["tool_choice"] = {"type": "function", "function": {"name": name}}
    if request.reasoning is not None:
        fields["reasoning"] = request.reasoning  # read by the reasoning controls
    text_format = (request.text or {}).get("format")
    if isinstance(text_format, dict) and text_format.get("type") == "json_schema":
        schema = {k: v for k, v in text_format.items() if k != "type"}
        fields["response_format"] = {"type": "json_schema", "json_schema": schema}
    elif isinstance(text_format, dict) and text_format.get("type") == "json_object":
        fields["response_format"] = {"type": "json_object"}
    try:
        return ChatCompletionRequest.model_validate(fields)
    except ValidationError as exc:
        return untranslatable(exc)


def response_object(
    request: ResponsesRequest,
    *,
    response_id: str,
    model: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None,
    status: str,
    finish_reason: str | None = None,
) -> dict[str, Any]:
    usage = usage or {}
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "model": model,
        "output": output,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if finish_reason == "length" else None,
        "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens,
        "metadata": request.metadata or {},
        "parallel_tool_calls": request.parallel_tool_calls
        if request.parallel_tool_calls is not None
        else True,
        "previous_response_id": request.previous_response_id,
        "reasoning": request.reasoning or {"effort": None, "summary": None},
        "store": request.store,
        "temperature": request.temperature,
        "text": request.text or {"format": {"type": "text"}},
        "tool_choice": request.tool_choice or "auto",
        "tools": request.tools or [],
        "top_p": request.top_p,
        "truncation": "disabled",
        "usage": {
            "input_tokens": int(usage.get("prompt_tokens") or 0),
            "input_tokens_details": {
                "cached_tokens": int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0),
                "cache_write_tokens": 0,  # required by the SDK's types; no prompt is cached on request
            },
            "output_tokens": int(usage.get("completion_tokens") or 0),
            "output_tokens_details": {
                "reasoning_tokens": int(
                    (usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
                )
            },
            "total_tokens": int(usage.get("total_tokens") or 0),
        },
    }


def call_arguments(arguments: str, finish_reason: str | None) -> tuple[str, str]:
    """A function call's ``arguments`` and ``status``: a call cut by the token budget keeps the
    unfinished JSON it had and is ``incomplete``; a complete call without arguments has ``{}``."""
    if finish_reason == "length":
        try:
            json.loads(arguments)
        except ValueError:
            return arguments, "incomplete"
    return arguments or "{}", "completed"


def output_items(
    message: dict[str, Any],
    finish_reason: str | None = None,
    *,
    tools: ResponsesTools | None = None,
    seal: ReasoningSeal | None = None,
) -> list[dict[str, Any]]:
    """A chat reply message as Responses output items (reasoning, sealed by ``seal`` when given;
    message; function and custom tool calls named back by ``tools``)."""
    items: list[dict[str, Any]] = []
    tools = tools or ResponsesTools()
    if message.get("reasoning_content"):
        items.append(reasoning_item(new_id("rs"), message["reasoning_content"], seal))
    if message.get("content"):
        items.append(message_item(new_id("msg"), message["content"]))
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        arguments, status = call_arguments(function.get("arguments") or "", finish_reason)
        offered, call_id = function.get("name", ""), call.get("id") or new_id("call")
        names = tools.call_fields(offered)
        if tools.is_custom(offered):
            items.append(custom_call_item(new_id("ctc"), call_id, names, custom_input(arguments), status))
        else:
            items.append(call_item(new_id("fc"), call_id, names, arguments, status))
    return items


def reasoning_item(item_id: str, text: str, seal: ReasoningSeal | None = None) -> dict[str, Any]:
    """A reasoning output item; with ``encrypted_content`` when ``seal`` is given (``include``
    asked for ``reasoning.encrypted_content``)."""
    item = {
        "type": "reasoning",
        "id": item_id,
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
    }
    if seal is not None:
        item["encrypted_content"] = seal.seal(text)
    return item


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [{"type": "output_text", "text": text, "annotations": []}] if status == "completed" else []
    return {"type": "message", "id": item_id, "role": "assistant", "status": status, "content": content}


def call_item(
    item_id: str, call_id: str, names: dict[str, str], arguments: str, status: str = "completed"
) -> dict[str, Any]:
    """A ``function_call`` item; ``names``: its ``name`` and, for a namespace's function, its
    ``namespace`` (:meth:`~sparkfold.api.responses.tools.ResponsesTools.call_fields`)."""
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call_id,
        **names,
        "arguments": arguments,
        "status": status,
    }


def custom_call_item(
    item_id: str, call_id: str, names: dict[str, str], text: str, status: str = "completed"
) -> dict[str, Any]:
    """A ``custom_tool_call`` item: its ``input`` is the freeform text (``names`` as for
    :func:`call_item`)."""
    return {
        "type": "custom_tool_call",
        "id": item_id,
        "call_id": call_id,
        **names,
        "input": text,
        "status": status,
    }
