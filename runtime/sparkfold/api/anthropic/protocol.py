"""Wire models of Anthropic's Messages API (https://docs.anthropic.com/en/api/messages).

Request fields in the order of the reference. Content blocks stay plain dicts (the translator
reads them by ``type`` and names the offending block when one is malformed), so a new block type
is an explicit 400 rather than a validation maze.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema

from sparkfold.protocol import (
    MAX_CONTENT_PARTS,
    MAX_MESSAGES,
    MAX_STOP,
    MAX_TOOLS,
    Content,
    Integer,
    ModelName,
    Tools,
    object_schema,
)

__all__ = ["CountTokensRequest", "CountTokensResponse", "Message", "MessagesRequest", "MessagesResponse"]


class _AnthropicRequest(BaseModel):
    # strict types, as Anthropic's: true is not a number, "yes" not a boolean
    model_config = ConfigDict(extra="allow", strict=True)


# What the translator takes (translate.py), said in the OpenAPI document; validation stays the
# translator's, which names the offending block.
_STRING = {"type": "string"}
_TEXT = object_schema(["type", "text"], type={"const": "text"}, text=_STRING)
_IMAGE = object_schema(
    ["type", "source"],
    type={"const": "image"},
    source={
        "anyOf": [
            object_schema(
                ["type", "media_type", "data"], type={"const": "base64"}, media_type=_STRING, data=_STRING
            ),
            object_schema(["type", "url"], type={"const": "url"}, url=_STRING),
        ]
    },
)
_TOOL_RESULT = object_schema(
    ["type", "tool_use_id"],
    type={"const": "tool_result"},
    tool_use_id=_STRING,
    content={"anyOf": [_STRING, {"type": "array", "items": {"anyOf": [_TEXT, _IMAGE]}}]},
    is_error={"type": "boolean"},
)
_TOOL_USE = object_schema(
    ["type", "id", "name", "input"],
    type={"const": "tool_use"},
    id=_STRING,
    name=_STRING,
    input={"type": "object"},
)
_THINKING = object_schema(
    ["type", "thinking"], type={"const": "thinking"}, thinking=_STRING, signature=_STRING
)
_REDACTED = object_schema(["type"], type={"const": "redacted_thinking"}, data=_STRING)


def _blocks(*kinds: dict[str, Any]) -> dict[str, Any]:
    items = {"anyOf": list(kinds)}
    return {
        "anyOf": [_STRING, {"type": "array", "minItems": 1, "maxItems": MAX_CONTENT_PARTS, "items": items}]
    }


MESSAGE_SCHEMA = {
    "anyOf": [
        object_schema(
            ["role", "content"], role={"const": "user"}, content=_blocks(_TEXT, _IMAGE, _TOOL_RESULT)
        ),
        object_schema(
            ["role", "content"],
            role={"const": "assistant"},
            content=_blocks(_TEXT, _THINKING, _REDACTED, _TOOL_USE),
        ),
        object_schema(["role", "content"], role={"const": "system"}, content=_blocks(_TEXT)),
    ]
}
SYSTEM_SCHEMA = _blocks(_TEXT)
TOOL_SCHEMA = {
    "anyOf": [
        object_schema(
            ["name", "input_schema"],
            type={"const": "custom"},
            name={"type": "string", "minLength": 1},
            input_schema={"type": "object"},
        ),
        object_schema(["type"], type={"type": "string", "pattern": "^[a-z][a-z0-9_]*_[0-9]{8}$"}),
    ]
}


class Message(_AnthropicRequest):
    # "system": a system turn in place, as Claude Code sends its environment block (anthropic
    # SDK: types/system_message_param.py)
    role: Literal["user", "assistant", "system"]
    content: Content


Messages = Annotated[
    list[Annotated[Message, WithJsonSchema(MESSAGE_SCHEMA)]], Field(min_length=1, max_length=MAX_MESSAGES)
]
AnthropicTools = Annotated[
    Tools, WithJsonSchema({"type": "array", "items": TOOL_SCHEMA, "maxItems": MAX_TOOLS})
]
System = Annotated[Content, WithJsonSchema(SYSTEM_SCHEMA)]
_PARALLEL = {"disable_parallel_tool_use": {"type": "boolean"}}
ToolChoice = Annotated[
    dict[str, Any],
    WithJsonSchema(
        {
            "anyOf": [
                object_schema(["type"], type={"enum": ["auto", "any", "none"]}, **_PARALLEL),
                object_schema(["type", "name"], type={"const": "tool"}, name=_STRING, **_PARALLEL),
            ]
        }
    ),
]


class MessagesRequest(_AnthropicRequest):
    model: ModelName
    messages: Messages
    max_tokens: Integer = Field(ge=1)
    container: Any = None
    mcp_servers: Any = None
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None
    stop_sequences: list[str] | None = Field(None, max_length=MAX_STOP)
    stream: bool = False
    system: System | None = None
    temperature: float | None = Field(None, ge=0, le=1)
    thinking: dict[str, Any] | None = None
    tool_choice: ToolChoice | None = None
    tools: AnthropicTools | None = None
    top_k: Integer | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    output_config: dict[str, Any] | None = Field(
        None, description="`effort` (low/medium/high/max) and `format` (a JSON schema for the answer)"
    )
    context_management: dict[str, Any] | None = Field(
        None, description="`edits`: `clear_thinking_20251015` is honoured, the others are logged as ignored"
    )


class CountTokensRequest(_AnthropicRequest):
    model: ModelName
    messages: Messages
    system: System | None = None
    thinking: dict[str, Any] | None = None
    tool_choice: ToolChoice | None = None
    tools: AnthropicTools | None = None
    output_config: dict[str, Any] | None = Field(
        None, description="`effort` counts as the reply's (`format` does not change the prompt)"
    )
    context_management: dict[str, Any] | None = Field(
        None, description="`clear_thinking_20251015` counts as the reply's"
    )


class CountTokensResponse(BaseModel):
    input_tokens: int


class MessageUsage(BaseModel):
    """A Messages reply's token counts, as Anthropic names them (the OpenAI dialect's is
    :class:`sparkfold.protocol.Usage`)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


class MessagesResponse(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[dict[str, Any]]
    stop_reason: Literal["end_turn", "max_tokens", "stop_sequence", "tool_use", "refusal"] | None
    stop_sequence: str | None = None
    usage: MessageUsage
