"""Chat messages and tools made safe for a GLM template (reference ``glm.md`` 5.2, 5.4, 5.5).

GLM templates trip over shapes that OpenAI clients send every day: ``content: null`` on a
tool-call turn renders the text ``None``; ``arguments: ""`` (or any JSON text) makes the template
call ``.items()`` on a string; reasoning sent back as ``reasoning`` is ignored. :func:`normalise_messages`
turns every message into the one shape both our template and a checkpoint's own expect;
:func:`normalise_tools` drops what the model must not see.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from sparkfold.glm.errors import RenderError
from sparkfold.glm.tokens import THINK, THINK_END

__all__ = [
    "IMAGE_PART_TYPES",
    "MEDIA_PART_TYPES",
    "TEXT_PART_TYPES",
    "VIDEO_PART_TYPES",
    "normalise_messages",
    "normalise_tools",
]

TEXT_PART_TYPES = frozenset({"text", "input_text"})
IMAGE_PART_TYPES = frozenset({"image_url", "image", "input_image"})
"""Content parts that carry a picture: the one list, for the engine and the gateway's limits alike."""
VIDEO_PART_TYPES = frozenset({"video_url", "video"})
MEDIA_PART_TYPES = IMAGE_PART_TYPES | VIDEO_PART_TYPES
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
_ROLES |= {"tool": "tool", "observation": "tool"}
_DROPPED_TOOL_KEYS = ("strict", "defer_loading")


def _as_dict(message: Mapping[str, Any] | BaseModel) -> dict[str, Any]:
    if isinstance(message, BaseModel):
        return message.model_dump(exclude_none=True)
    return dict(message)


def _content(content: Any, where: str) -> str | list[dict[str, Any]]:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise RenderError("content must be a string or a list of parts", param=where)
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in TEXT_PART_TYPES:
            parts.append({"type": "text", "text": str(part.get("text") or "")})
        elif kind in MEDIA_PART_TYPES:
            parts.append(dict(part))
        else:
            raise RenderError(
                f"unsupported content part type {kind!r}; use text, image_url or video_url",
                param=f"{where}[{j}].type",
            )
    return parts


def _arguments(arguments: Any, where: str) -> dict[str, Any]:
    if arguments is None:
        return {}
    if isinstance(arguments, Mapping):
        return dict(arguments)
    if isinstance(arguments, str):
        if not arguments.strip():
            return {}
        try:
            value = json.loads(arguments)
        except json.JSONDecodeError as exc:
            raise RenderError(f"arguments are not valid JSON: {exc.msg}", param=where) from None
        if isinstance(value, dict):
            return value
    raise RenderError("arguments must be a JSON object", param=where)


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for j, call in enumerate(calls or []):
        function = dict(call.get("function") or {})
        if not function.get("name"):
            raise RenderError("a tool call needs a function name", param=f"{where}[{j}].function.name")
        function["arguments"] = _arguments(function.get("arguments"), f"{where}[{j}].function.arguments")
        out.append({"id": call.get("id"), "type": "function", "function": function})
    return out


def _split_reasoning(message: dict[str, Any]) -> None:
    content = message.get("content")
    if isinstance(content, str) and THINK_END in content:
        reasoning, _, rest = content.partition(THINK_END)
        message["content"] = rest
        if not message.get("reasoning_content"):
            message["reasoning_content"] = reasoning.split(THINK)[-1]


def _order_tool_results(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive tool results follow the order of the calls they answer, when every id matches."""
    out: list[dict[str, Any]] = []
    i = 0
    while i < len(messages):
        message = messages[i]
        out.append(message)
        i += 1
        if message["role"] != "assistant" or not message.get("tool_calls"):
            continue
        j = i
        while j < len(messages) and messages[j]["role"] == "tool":
            j += 1
        results = messages[i:j]
        order = [call["id"] for call in message["tool_calls"]]
        ids = [result.get("tool_call_id") for result in results]
        if results and None not in order and sorted(ids, key=str) == sorted(order, key=str):
            results = sorted(results, key=lambda r: order.index(r["tool_call_id"]))
        out += results
        i = j
    return out


def normalise_messages(messages: Sequence[Mapping[str, Any] | BaseModel]) -> list[dict[str, Any]]:
    """Plain dicts every GLM template renders correctly; a bad message raises :class:`RenderError`."""
    out: list[dict[str, Any]] = []
    for i, raw in enumerate(messages):
        message = _as_dict(raw)
        role = _ROLES.get(str(message.get("role")))
        if role is None:
            raise RenderError(f"unknown role {message.get('role')!r}", param=f"messages[{i}].role")
        clean: dict[str, Any] = {
            "role": role,
            "content": _content(message.get("content"), f"messages[{i}].content"),
        }
        if role == "assistant":
            reasoning = message.get("reasoning_content") or message.get("reasoning")
            if reasoning:
                clean["reasoning_content"] = str(reasoning)
            _split_reasoning(clean)
            if message.get("tool_calls"):
                clean["tool_calls"] = _tool_calls(message["tool_calls"], f"messages[{i}].tool_calls")
        if role == "tool" and message.get("tool_call_id") is not None:
            clean["tool_call_id"] = message["tool_call_id"]
        if message.get("name"):
            clean["name"] = message["name"]
        out.append(clean)
    return _order_tool_results(out)


def normalise_tools(tools: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    """The tools the model is shown: deferred ones left out, ``strict``/``defer_loading`` dropped."""
    out: list[dict[str, Any]] = []
    for i, raw in enumerate(tools or []):
        tool = dict(raw)
        function = dict(tool.get("function") or {})
        if not function.get("name"):
            raise RenderError("a tool needs function.name", param=f"tools[{i}].function.name")
        if tool.get("defer_loading") or function.get("defer_loading"):
            continue
        for key in _DROPPED_TOOL_KEYS:
            tool.pop(key, None)
            function.pop(key, None)
        tool["type"] = tool.get("type", "function")
        tool["function"] = function
        out.append(tool)
    return out
