"""Anthropic Messages <-> the engine's chat completions.

:func:`to_chat` turns a Messages request into a chat request (system prompt, system turns in
place, text and image blocks, ``tool_use`` / ``tool_result``, thinking blocks as
``reasoning_content`` (``redacted_thinking`` blocks dropped; an empty one restored from its
signature, :mod:`sparkfold.api.sealed`), stop sequences, ``thinking``, ``output_config.effort`` and
``.format``, ``context_management``) or an error naming the block.
:func:`from_chat` turns a chat completion into a Messages response.

Tools: a custom tool (``input_schema``) is offered as a function; a tool Anthropic defines (a
``type`` such as ``web_search_20250305`` or ``bash_20250124``, anthropic SDK:
``types/tool_union_param.py``) runs on Anthropic's servers or is called in a shape the model was
not shown: it is not offered (:mod:`sparkfold.api.ignored_tools`).
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import ValidationError
from pydantic_core import from_json

from sparkfold.api.anthropic.context import apply_clear_thinking, thinking_turns_kept
from sparkfold.api.anthropic.protocol import CountTokensRequest, MessagesRequest
from sparkfold.api.errors import InvalidRequest, untranslatable
from sparkfold.api.sealed import ReasoningSeal
from sparkfold.api.tool_results import orphan_result
from sparkfold.protocol import ChatCompletionRequest, new_id

__all__ = [
    "STOP_REASONS",
    "anthropic_usage",
    "chat_tools",
    "from_chat",
    "omits_thinking",
    "prompt_of",
    "reasoning_fields",
    "redacted_blocks",
    "thinking_block",
    "to_chat",
    "to_chat_messages",
]

STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
ANTHROPIC_TOOL_TYPE = re.compile(r"[a-z][a-z0-9_]*_[0-9]{8}")
"""The ``type`` of a tool Anthropic defines: its name and version date (``web_search_20250305``)."""
_REFUSED = ("container", "mcp_servers")


def _text_of(content: Any, where: str) -> str | InvalidRequest:
    if isinstance(content, str):
        return content
    texts = []
    for j, block in enumerate(content or []):
        if (
            not isinstance(block, dict)
            or block.get("type") != "text"
            or not isinstance(block.get("text"), str)
        ):
            return InvalidRequest(f"{where}[{j}] must be a text block", param=f"{where}[{j}]")
        texts.append(block["text"])
    return "\n\n".join(texts)


def _image_part(block: dict[str, Any], where: str) -> dict[str, Any] | InvalidRequest:
    source = block.get("source")
    if isinstance(source, dict) and source.get("type") == "base64":
        media, data = source.get("media_type"), source.get("data")
        if isinstance(media, str) and isinstance(data, str):
            return {"type": "image_url", "image_url": {"url": f"data:{media};base64,{data}"}}
    if isinstance(source, dict) and source.get("type") == "url" and isinstance(source.get("url"), str):
        return {"type": "image_url", "image_url": {"url": source["url"]}}
    return InvalidRequest(
        f"{where}.source must be {{type: base64, media_type, data}} or {{type: url, url}}", param=where
    )


def _user_turn(content: list[dict[str, Any]], where: str) -> list[dict[str, Any]] | InvalidRequest:
    """A user turn: tool results first (as ``tool`` messages), then text and images."""
    messages: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    carried: list[dict[str, Any]] = []  # images inside tool results ride with the user message
    for j, block in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image":
            part = _image_part(block, at)
            if isinstance(part, InvalidRequest):
                return part
            parts.append(part)
        elif kind == "tool_result" and isinstance(block.get("tool_use_id"), str):
            inner = block.get("content", "")
            texts: list[str] = []
            for k, item in enumerate([inner] if isinstance(inner, str) else inner or []):
                if isinstance(item, str):
                    texts.append(item)
                elif (
                    isinstance(item, dict)
                    and item.get("type") == "text"
                    and isinstance(item.get("text"), str)
                ):
                    texts.append(item["text"])
                elif isinstance(item, dict) and item.get("type") == "image":
                    part = _image_part(item, f"{at}.content[{k}]")
                    if isinstance(part, InvalidRequest):
                        return part
                    carried.append(part)
                else:
                    return InvalidRequest(f"{at}.content[{k}] must be a text or image block", param=at)
            text = "\n".join(texts)
            if block.get("is_error"):
                text = f"[tool error] {text}"
            messages.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": text})
        else:
            return InvalidRequest(
                f"{at}: unsupported or malformed block (type {kind!r}) in a user message; "
                "use text, image or tool_result",
                param=at,
            )
    if parts or carried:
        messages.append({"role": "user", "content": parts + carried})
    return messages


def _thinking(block: dict[str, Any], seal: ReasoningSeal, where: str) -> str | InvalidRequest:
    """A thinking block's text; an empty one (the reply omitted it, ``thinking.display:
    "omitted"``) is restored from a signature this server wrote. Another server's signature (a
    conversation begun on Anthropic's) is not read; one of this server's form that does not check
    is a 400, as Anthropic's API answers an invalid signature."""
    signature = block.get("signature")
    if not ReasoningSeal.is_sealed(signature):
        return str(block["thinking"])
    opened = seal.open(signature, f"{where}.signature")
    if isinstance(opened, InvalidRequest):
        return opened
    return str(block["thinking"]) or (opened or "")


def _assistant_turn(
    content: list[dict[str, Any]], where: str, seal: ReasoningSeal
) -> dict[str, Any] | InvalidRequest:
    text, reasoning, calls = [], [], []
    for j, block in enumerate(content):
        at = f"{where}.content[{j}]"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text" and isinstance(block.get("text"), str):
            text.append(block["text"])
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            thought = _thinking(block, seal, at)
            if isinstance(thought, InvalidRequest):
                return thought
            reasoning.append(thought)
        elif kind == "tool_use" and isinstance(block.get("id"), str) and isinstance(block.get("name"), str):
            arguments = block.get("input", {})
            if not isinstance(arguments, dict):
                return InvalidRequest(f"{at}.input must be an object", param=f"{at}.input")
            calls.append(
                {
                    "id": block["id"],
                    "type": "function",
                    "function": {
                        "name": block["name"],
                        "arguments": json.dumps(arguments, ensure_ascii=False),
                    },
                }
            )
        elif kind == "redacted_thinking":
            continue  # opaque to all but Anthropic's servers: dropped (see redacted_blocks)
        else:
            return InvalidRequest(
                f"{at}: unsupported or malformed block (type {kind!r}) in an assistant message; "
                "use text, thinking or tool_use",
                param=at,
            )
    message: dict[str, Any] = {"role": "assistant", "content": "".join(text)}
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    return message


def redacted_blocks(request: MessagesRequest | CountTokensRequest) -> list[str]:
    """Where the assistant turns carry ``redacted_thinking`` blocks, which the translation drops:
    Claude Code sends its history back with them, and only Anthropic's servers can read them."""
    return [
        f"messages[{i}].content[{j}]"
        for i, message in enumerate(request.messages)
        if message.role == "assistant" and not isinstance(message.content, str)
        for j, block in enumerate(message.content)
        if isinstance(block, dict) and block.get("type") == "redacted_thinking"
    ]


def to_chat_messages(
    request: MessagesRequest | CountTokensRequest, seal: ReasoningSeal
) -> list[dict[str, Any]] | InvalidRequest:
    """The request's chat messages: ``system`` first, then each message; a ``system`` message
    among them is a system turn in its place (GLM's template renders one anywhere)."""
    messages: list[dict[str, Any]] = []
    if request.system is not None:
        system = _text_of(request.system, "system")
        if isinstance(system, InvalidRequest):
            return system
        messages.append({"role": "system", "content": system})
    for i, message in enumerate(request.messages):
        where = f"messages[{i}]"
        if message.role == "system" or isinstance(message.content, str):
            text = _text_of(message.content, f"{where}.content")
            if isinstance(text, InvalidRequest):
                return text
            messages.append({"role": message.role, "content": text})
            continue
        turn = (
            _user_turn(message.content, where)
            if message.role == "user"
            else _assistant_turn(message.content, where, seal)
        )
        if isinstance(turn, InvalidRequest):
            return turn
        messages += turn if isinstance(turn, list) else [turn]
    orphan = orphan_result(messages)
    if orphan is not None:
        where = _tool_result_place(request, orphan[1])
        return InvalidRequest(
            f"{where}: tool_result's tool_use_id {orphan[1]!r} is the id of no tool_use block of an "
            "earlier assistant message; a tool_result answers a tool_use the conversation made",
            param=where,
        )
    kept = thinking_turns_kept(request.context_management)
    if kept is not None:
        apply_clear_thinking(messages, kept)
    return messages


def _tool_result_place(request: MessagesRequest | CountTokensRequest, tool_use_id: str) -> str:
    """Where the first ``tool_result`` block with ``tool_use_id`` is."""
    for i, message in enumerate(request.messages):
        for j, block in enumerate([] if isinstance(message.content, str) else message.content):
            if isinstance(block, dict) and block.get("tool_use_id") == tool_use_id:
                return f"messages[{i}].content[{j}]"
    return "messages"


def chat_tools(
    request: MessagesRequest | CountTokensRequest,
) -> tuple[list[dict[str, Any]] | None, list[str]] | InvalidRequest:
    """The custom tools as chat functions, and the Anthropic-defined tools left out (their labels)."""
    if request.tools is None:
        return None, []
    tools, ignored = [], []
    for i, tool in enumerate(request.tools):
        kind = tool.get("type")
        if isinstance(kind, str) and ANTHROPIC_TOOL_TYPE.fullmatch(kind):
            name = tool.get("name")
            ignored.append(kind + (f":{name}" if isinstance(name, str) and name else ""))
            continue
        if (
            kind not in (None, "custom")
            or not isinstance(tool.get("name"), str)
            or not isinstance(tool.get("input_schema"), dict)
        ):
            return InvalidRequest(
                f"tools[{i}] needs a name and an input_schema object (a custom tool), or the type of "
                "a tool Anthropic defines (such as web_search_20250305, which is not offered to the model)",
                param=f"tools[{i}]",
            )
        function = {"name": tool["name"], "parameters": tool["input_schema"]}
        if isinstance(tool.get("description"), str):
            function["description"] = tool["description"]
        tools.append({"type": "function", "function": function})
    return tools, ignored


def prompt_of(
    request: MessagesRequest | CountTokensRequest, seal: ReasoningSeal
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None] | InvalidRequest:
    """The chat messages and tools of a Messages or count_tokens request: what the prompt shows."""
    messages = to_chat_messages(request, seal)
    if isinstance(messages, InvalidRequest):
        return messages
    tools = chat_tools(request)
    if isinstance(tools, InvalidRequest):
        return tools
    return messages, tools[0]


def reasoning_fields(request: MessagesRequest | CountTokensRequest) -> dict[str, Any]:
    """The request's reasoning switches as chat fields (``thinking``, ``reasoning_effort`` from
    ``output_config.effort``; a ``clear_thinking`` edit's turns rendered with their reasoning,
    :mod:`sparkfold.api.anthropic.context`), resolved by
    :func:`sparkfold.api.reasoning.resolve_reasoning`: the reply's and its count's alike."""
    fields: dict[str, Any] = {}
    if thinking_turns_kept(request.context_management) is not None:
        fields["chat_template_kwargs"] = {"clear_thinking": False}
    if request.thinking is not None:
        fields["thinking"] = request.thinking
    effort = (request.output_config or {}).get("effort")
    if effort is not None:
        fields["reasoning_effort"] = effort
    return fields


def _tool_choice(choice: dict[str, Any] | None) -> tuple[Any, bool | None] | InvalidRequest:
    if choice is None:
        return None, None
    kind = choice.get("type")
    parallel = False if choice.get("disable_parallel_tool_use") else None
    if kind == "auto":
        return "auto", parallel
    if kind == "any":
        return "required", parallel
    if kind == "none":
        return "none", parallel
    if kind == "tool" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}, parallel
    return InvalidRequest(
        "tool_choice.type must be auto, any, none or tool (with a name)", param="tool_choice"
    )


def _response_format(fmt: Any) -> dict[str, Any] | InvalidRequest:
    """Anthropic's ``output_config.format`` (``{type: json_schema, schema}``) as OpenAI's
    ``response_format`` (``{type: json_schema, json_schema: {name, schema}}``), which the engines read."""
    if (
        not isinstance(fmt, dict)
        or fmt.get("type") != "json_schema"
        or not isinstance(fmt.get("schema"), dict)
    ):
        return InvalidRequest(
            'output_config.format must be {"type": "json_schema", "schema": {...}}',
            param="output_config.format",
        )
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": fmt["schema"]}}


def to_chat(request: MessagesRequest, seal: ReasoningSeal) -> ChatCompletionRequest | InvalidRequest:
    for name in _REFUSED:
        if getattr(request, name) is not None:
            return InvalidRequest(f"{name} is not supported by this server; leave it out", param=name)
    prompt = prompt_of(request, seal)
    if isinstance(prompt, InvalidRequest):
        return prompt
    messages, tools = prompt
    if request.messages[-1].role == "assistant":
        last = f"messages[{len(request.messages) - 1}]"
        return InvalidRequest(
            f"{last}: a final assistant turn (a prefill) is not supported: the engine answers a new "
            "turn instead of continuing it; end with a user turn (ask for the start in the prompt, "
            "or use output_config.format for JSON)",
            param=last,
        )
    choice = _tool_choice(request.tool_choice)
    if isinstance(choice, InvalidRequest):
        return choice
    fields: dict[str, Any] = {
        "model": request.model,
        "messages": messages,
        "max_tokens": request.max_tokens,
        "stream": request.stream,
    }
    if request.stream:
        # continuous_usage_stats: the engine's first chunk carries the prompt's tokens (message_start)
        fields["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    for name in ("temperature", "top_p", "top_k"):
        if getattr(request, name) is not None:
            fields[name] = getattr(request, name)
    if request.stop_sequences:
        fields["stop"] = request.stop_sequences
    if tools is not None:
        fields["tools"] = tools
    if choice[0] is not None:
        fields["tool_choice"] = choice[0]
    if choice[1] is not None:
        fields["parallel_tool_calls"] = choice[1]
    fields |= reasoning_fields(request)
    config = request.output_config or {}
    if config.get("format") is not None:
        response_format = _response_format(config["format"])
        if isinstance(response_format, InvalidRequest):
            return response_format
        fields["response_format"] = response_format
    try:
        return ChatCompletionRequest.model_validate(fields)
    except ValidationError as exc:
        return untranslatable(exc)


def thinking_block(text: str, seal: ReasoningSeal, *, omitted: bool) -> dict[str, Any]:
    """A thinking block: its text (none when ``omitted``, ``thinking.display: "omitted"``) and a
    signature that brings the text back when the block is sent back."""
    return {"type": "thinking", "thinking": "" if omitted else text, "signature": seal.seal(text)}


def omits_thinking(request: MessagesRequest) -> bool:
    """Whether thinking blocks go out without their text (``thinking.display: "omitted"``)."""
    return (request.thinking or {}).get("display") == "omitted"


def from_chat(
    result: dict[str, Any],
    *,
    model: str,
    stop_sequences: list[str] | None,
    seal: ReasoningSeal,
    omit_thinking: bool = False,
) -> dict[str, Any]:
    """A chat completion as a Messages response."""
    choice = (result.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    content: list[dict[str, Any]] = []
    if message.get("reasoning_content"):
        content.append(thinking_block(message["reasoning_content"], seal, omitted=omit_thinking))
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        try:  # a call cut by max_tokens: its input as far as it was written, a cut string included
            arguments = from_json(function.get("arguments") or "{}", allow_partial="trailing-strings")
        except ValueError:
            arguments = {}
        content.append(
            {
                "type": "tool_use",
                "id": call.get("id") or new_id("toolu", "_"),
                "name": function.get("name", ""),
                "input": arguments if isinstance(arguments, dict) else {},
            }
        )
    stop_reason, stop_sequence = stop_of(choice, stop_sequences)
    usage = result.get("usage") or {}
    return {
        "id": new_id("msg", "_"),
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": anthropic_usage(usage),
    }


def stop_of(choice: dict[str, Any], stop_sequences: list[str] | None) -> tuple[str, str | None]:
    finish = choice.get("finish_reason") or "stop"
    matched = choice.get("stop_reason")
    if finish == "stop" and isinstance(matched, str) and matched in (stop_sequences or []):
        return "stop_sequence", matched
    return STOP_REASONS.get(finish, "end_turn"), None


def anthropic_usage(usage: dict[str, Any]) -> dict[str, Any]:
    """A chat usage block as Anthropic's: both cache fields always there, as integers. Anthropic's
    ``input_tokens`` are the prompt's tokens *not* read from the cache (the prompt is
    ``input_tokens + cache_creation_input_tokens + cache_read_input_tokens``, which clients such as
    Claude Code add up to size their context), so the engine's ``cached_tokens`` are taken out of
    them. Our engines reuse cached prefixes on their own, so no prompt ever *creates* a cache entry
    in Anthropic's sense (one the client asked for): ``cache_creation_input_tokens`` is 0."""
    details = usage.get("prompt_tokens_details") or {}
    prompt = int(usage.get("prompt_tokens") or 0)
    cached = min(int(details.get("cached_tokens") or 0), prompt)
    return {
        "input_tokens": prompt - cached,
        "output_tokens": int(usage.get("completion_tokens") or 0),
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": cached,
    }
