"""Wire models of OpenAI's Responses API (https://platform.openai.com/docs/api-reference/responses/create).

Request fields in the order of the reference; input items stay plain dicts that the translator
reads by ``type`` (naming the offending item when one is malformed).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from sparkfold.protocol import MAX_MESSAGES, ModelName, Tools

__all__ = ["INCLUDE_VALUES", "TEXT_FORMATS", "ResponsesRequest"]

# The API's values: reasoning.encrypted_content is honoured (see api/sealed.py); the
# others are accepted and ignored (this server has no such data to add).
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


TEXT_FORMATS = frozenset({"text", "json_object", "json_schema"})


def _tool_choice(value: str | dict[str, Any]) -> str | dict[str, Any]:
    if isinstance(value, str):
        if value not in ("none", "auto", "required"):
            raise ValueError(f"must be none, auto, required or a function object, not {value!r}")
    elif value.get("type") != "function" or not isinstance(value.get("name"), str) or not value["name"]:
        raise ValueError('an object tool_choice must be {"type": "function", "name": ...}')
    return value


def _text(value: dict[str, Any]) -> dict[str, Any]:
    fmt = value.get("format")
    if fmt is None:
        return value
    if not isinstance(fmt, dict) or fmt.get("type") not in TEXT_FORMATS:
        raise ValueError(f"text.format.type must be one of {', '.join(sorted(TEXT_FORMATS))}")
    return value


class ResponsesRequest(BaseModel):
    # strict types, as OpenAI's: true is not a number, "yes" not a boolean
    model_config = ConfigDict(extra="allow", strict=True)

    model: ModelName | None = None
    input: str | Annotated[list[dict[str, Any]], Field(max_length=MAX_MESSAGES)]
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
    text: Annotated[dict[str, Any], AfterValidator(_text)] | None = None
    tool_choice: Annotated[str | dict[str, Any], AfterValidator(_tool_choice)] | None = None
    tools: Tools | None = None
    top_p: float | None = Field(None, gt=0, le=1)
    user: str | None = None
