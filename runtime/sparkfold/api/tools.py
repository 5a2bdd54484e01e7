"""Tool-call hygiene: only offered tools come back as calls, with arguments typed by their schema.

A call to a tool the request did not offer is turned into text (``<tool_call>{json}</tool_call>``
appended to the content), so a client never receives a call it cannot dispatch. Arguments are
fitted to the offered JSON schema by :func:`sparkfold.glm.arguments.repair_arguments` (the one home
of that rule): a value that fits is kept, one that does not is repaired where one repair makes it
fit (``"3"`` for an integer becomes ``3``).

Streamed calls (:mod:`sparkfold.api.chunks`): the name comes first, so a call to a tool not offered
is held before any piece of it goes out and becomes text when the reply ends; the arguments stream
as the engine writes them and are not refitted (a piece sent cannot be taken back): our GLM engines
type each value by the schema as they write it, another engine's pieces are relayed as it sends
them. Whole calls (non-streamed replies) are fitted here.
"""

from __future__ import annotations

import json
from typing import Any

from sparkfold.glm.arguments import repair_arguments

__all__ = ["Toolbox"]


class Toolbox:
    """The tools a request offered, by name."""

    def __init__(self, tools: list[dict[str, Any]] | None) -> None:
        self.schemas: dict[str, Any] = {}
        for tool in tools or []:
            if not isinstance(tool, dict):
                continue
            function: dict[str, Any] = tool["function"] if isinstance(tool.get("function"), dict) else tool
            name = function.get("name")
            if isinstance(name, str):
                self.schemas[name] = function.get("parameters")

    def __repr__(self) -> str:
        return f"Toolbox({sorted(self.schemas)})"

    def offers(self, name: Any) -> bool:
        return isinstance(name, str) and name in self.schemas

    def typed_arguments(self, name: str, arguments: Any) -> str:
        """``arguments`` (JSON text) coerced to the schema of ``name``; unchanged if not a JSON object."""
        text: str = (
            arguments
            if isinstance(arguments, str)
            else json.dumps(arguments)
            if arguments is not None
            else "{}"
        )
        try:
            parsed = json.loads(text) if text.strip() else {}
        except ValueError:
            return text
        if not isinstance(parsed, dict):
            return text
        schema = self.schemas.get(name)
        if not isinstance(schema, dict):
            return text
        repaired = repair_arguments(parsed, schema)
        return text if repaired == parsed else json.dumps(repaired, ensure_ascii=False)

    @staticmethod
    def as_text(name: Any, arguments: Any) -> str:
        try:
            parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
        except ValueError:
            parsed = arguments
        return (
            "<tool_call>"
            + json.dumps({"name": name, "arguments": parsed}, ensure_ascii=False)
            + "</tool_call>"
        )

    def clean_calls(self, calls: list[Any]) -> tuple[list[dict[str, Any]], str]:
        """Split ``calls`` into offered calls (arguments typed) and the text of the others."""
        kept: list[dict[str, Any]] = []
        text = ""
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict):
                continue
            name, arguments = function.get("name"), function.get("arguments", "{}")
            if isinstance(name, str) and self.offers(name):
                kept.append(
                    {
                        **call,
                        "type": "function",
                        "function": {**function, "arguments": self.typed_arguments(name, arguments)},
                    }
                )
            else:
                text += self.as_text(name, arguments)
        return kept, text

    def clean_message(self, choice: dict[str, Any]) -> None:
        """Apply the hygiene to one non-streamed choice, in place."""
        message = choice.get("message")
        if not isinstance(message, dict) or not message.get("tool_calls"):
            return
        calls = message["tool_calls"] if isinstance(message["tool_calls"], list) else []
        kept, text = self.clean_calls(calls)
        if text:
            message["content"] = (message.get("content") or "") + text
        message["tool_calls"] = kept or None
        if not kept:
            message.pop("tool_calls", None)
            if choice.get("finish_reason") == "tool_calls":
                choice["finish_reason"] = "stop"
