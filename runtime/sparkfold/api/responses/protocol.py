"""Wire models of OpenAI's Responses API (https://platform.openai.com/docs/api-reference/responses/create).

Request fields in the order of the reference; input items stay plain dicts that the translator
reads by ``type`` (naming the offending item when one is malformed).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["INCLUDE_VALUES", "ResponsesRequest"]

# Accepted for compatibility and ignored (this server has no such data to add).
INCLUDE_VALUES = frozenset(
    {
        "reasoning.encrypted_content",
        "message.output_text.logprobs",
        "message.input_image.image_url",
        "computer_call_output.output.image_url",
        "file_search_call.results",
        "web_search_call.results",
        "web_search_call.action.sources",
        "code_interpreter_call.outputs",
    }
)


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    input: str | list[dict[str, Any]]
    include: list[str] | None = None
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    metadata: dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    previous_response_id: str | None = None
    reasoning: dict[str, Any] | None = Field(None, description="`effort`: none..max (mapped onto GLM's)")
    store: bool = True
    stream: bool = False
    temperature: float | None = Field(None, ge=0, le=2)
    text: dict[str, Any] | None = None
    tool_choice: str | dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    top_p: float | None = Field(None, gt=0, le=1)
    user: str | None = None
