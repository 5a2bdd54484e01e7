"""Wire models of Anthropic's Messages API (https://docs.anthropic.com/en/api/messages).

Request fields in the order of the reference. Content blocks stay plain dicts (the translator
reads them by ``type`` and names the offending block when one is malformed), so a new block type
is an explicit 400 rather than a validation maze.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from sparkfold.protocol import MAX_MESSAGES, MAX_STOP, Content, ModelName, Tools

__all__ = ["CountTokensRequest", "CountTokensResponse", "Message", "MessagesRequest", "MessagesResponse"]


class _Request(BaseModel):
    # strict types, as Anthropic's: true is not a number, "yes" not a boolean
    model_config = ConfigDict(extra="allow", strict=True)


class Message(_Request):
    # "system": a system turn in place, as Claude Code sends its environment block (anthropic
    # SDK: types/system_message_param.py)
    role: Literal["user", "assistant", "system"]
    content: Content


class MessagesRequest(_Request):
    model: ModelName
    messages: list[Message] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_tokens: int = Field(ge=1)
    container: Any = None
    mcp_servers: Any = None
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None
    stop_sequences: list[str] | None = Field(None, max_length=MAX_STOP)
    stream: bool = False
    system: Content | None = None
    temperature: float | None = Field(None, ge=0, le=1)
    thinking: dict[str, Any] | None = None
    tool_choice: dict[str, Any] | None = None
    tools: Tools | None = None
    top_k: int | None = Field(None, ge=0)
    top_p: float | None = Field(None, ge=0, le=1)
    output_config: dict[str, Any] | None = Field(
        None, description="`effort` (low/medium/high/max) and `format` (a JSON schema for the answer)"
    )
    context_management: dict[str, Any] | None = Field(
        None, description="`edits`: `clear_thinking_20251015` is honoured, the others are logged as ignored"
    )


class CountTokensRequest(_Request):
    model: ModelName
    messages: list[Message] = Field(min_length=1, max_length=MAX_MESSAGES)
    system: Content | None = None
    thinking: dict[str, Any] | None = None
    tool_choice: dict[str, Any] | None = None
    tools: Tools | None = None
    output_config: dict[str, Any] | None = Field(
        None, description="`effort` counts as the reply's (`format` does not change the prompt)"
    )
    context_management: dict[str, Any] | None = Field(
        None, description="`clear_thinking_20251015` counts as the reply's"
    )


class CountTokensResponse(BaseModel):
    input_tokens: int


class Usage(BaseModel):
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
    usage: Usage
