"""Tool-call hygiene: only offered tools come back as calls, with arguments typed by their schema.

A call to a tool the request did not offer is turned into text (``<tool_call>{json}</tool_call>``
appended to the content), so a client never receives a call it cannot dispatch. Arguments are
coerced to the offered JSON schema's property types where that is unambiguous: ``"3"`` for an
integer becomes ``3``, ``"true"`` for a boolean ``true``, a JSON string holding an array or an
object for such a property is parsed; anything ambiguous (unions, unparseable text) is left as is.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["Toolbox"]

_TRUE, _FALSE = ("true", "True"), ("false", "False")


def _coerce(value: Any, schema: Any) -> Any:
    if not isinstance(schema, dict):
        return value
    kind = schema.get("type")
    if not isinstance(kind, str):
        return value
    if isinstance(value, str):
        text = value.strip()
        if kind == "integer":
            try:
                return int(text)
            except ValueError:
                try:
                    number = float(text)
                except ValueError:
                    return value
                return int(number) if math.isfinite(number) and number.is_integer() else value
        if kind == "number":
            try:
                number = float(text)
            except ValueError:
                return value
            if not math.isfinite(number):
                return value
            return (
                int(number) if number.is_integer() and "." not in text and "e" not in text.lower() else number
            )
        if kind == "boolean":
            return True if text in _TRUE else False if text in _FALSE else value
        if kind == "null" and text in ("null", "None", ""):
            return None
        if kind in ("array", "object"):
            try:
                parsed = json.loads(text)
            except ValueError:
                return value
            if isinstance(parsed, list if kind == "array" else dict):
                return _coerce(parsed, schema)
            return value
        return value
    if kind == "string" and isinstance(value, int | float) and not isinstance(value, bool):
        return json.dumps(value)
    if kind == "object" and isinstance(value, dict):
        properties = schema.get("properties")
        if isinstance(properties, dict):
            return {k: _coerce(v, properties.get(k)) for k, v in value.items()}
        return value
    if kind == "array" and isinstance(value, list):
        return [_coerce(item, schema.get("items")) for item in value]
    if kind == "integer" and isinstance(value, float) and value.is_integer():
        return int(value)
    return value


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
        coerced = _coerce(parsed, {**schema, "type": "object"})
        return text if coerced == parsed else json.dumps(coerced, ensure_ascii=False)

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
