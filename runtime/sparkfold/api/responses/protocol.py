"""Wire models of OpenAI's Responses API (https://platform.openai.com/docs/api-reference/responses/create).

Request fields in the order of the reference; input items stay plain dicts that the translator
reads by ``type`` (naming the offending item when one is malformed).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema

from sparkfold.api.responses.tools import NOT_OFFERED
from sparkfold.protocol import (
    MAX_MESSAGES,
    MAX_TOOLS,
    Integer,
    ModelName,
    Tools,
    object_schema,
    tool_choice_schema,
)

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
    elif value.get("type") not in ("function", "custom") or not isinstance(value.get("name"), str):
        raise ValueError('an object tool_choice must be {"type": "function" or "custom", "name": ...}')
    elif not value["name"]:
        raise ValueError("an object tool_choice needs a name")
    return value


def _text(value: dict[str, Any]) -> dict[str, Any]:
    fmt = value.get("format")
    if fmt is None:
        return value
    if not isinstance(fmt, dict) or fmt.get("type") not in TEXT_FORMATS:
        raise ValueError(f"text.format.type must be one of {', '.join(sorted(TEXT_FORMATS))}")
    return value


# What the translator takes (translate.py, tools.py), said in the OpenAPI document; validation
# stays theirs, which names the offending item.
_STRING = {"type": "string"}
_NAME = {"type": "string", "minLength": 1}
_PARTS = {
    "type": "array",
    "items": {
        "anyOf": [
            object_schema(
                ["type", "text"], type={"enum": ["input_text", "output_text", "text"]}, text=_STRING
            ),
            object_schema(["type", "image_url"], type={"const": "input_image"}, image_url=_STRING),
        ]
    },
}
_CONTENT = {"anyOf": [_STRING, _PARTS]}
_FUNCTION = object_schema(
    ["type", "name"],
    type={"const": "function"},
    name=_NAME,
    description=_STRING,
    parameters={"type": "object"},
)
_CUSTOM = object_schema(
    ["type", "name"],
    type={"const": "custom"},
    name=_NAME,
    description=_STRING,
    format={
        "anyOf": [
            object_schema(["type"], type={"const": "text"}),
            object_schema(
                ["type", "syntax", "definition"],
                type={"const": "grammar"},
                syntax={"enum": ["lark", "regex"]},
                definition={"type": "string", "minLength": 1},
            ),
        ]
    },
)
TOOL_SCHEMA = {
    "anyOf": [
        _FUNCTION,
        _CUSTOM,
        object_schema(
            ["type", "name", "tools"],
            type={"const": "namespace"},
            name=_NAME,
            tools={
                "type": "array",
                "items": {
                    "anyOf": [
                        _FUNCTION,
                        _CUSTOM,
                    ]
                },
            },
        ),
        object_schema(["type"], type={"enum": list(NOT_OFFERED)}),
    ]
}


def _call_items(kind: str, payload: str) -> list[dict[str, Any]]:
    """A call input item (``function_call`` or ``custom_tool_call``, its ``payload`` field) and its output."""
    call = object_schema(
        ["type", "name", "call_id"],
        type={"const": kind},
        name=_STRING,
        call_id=_STRING,
        namespace=_STRING,
        **{payload: _STRING},
    )
    output = object_schema(
        ["type", "call_id"], type={"const": f"{kind}_output"}, call_id=_STRING, output=_CONTENT
    )
    return [call, output]


INPUT_ITEM_SCHEMA = {
    "anyOf": [
        object_schema(
            ["role", "content"],
            type={"const": "message"},
            role={"enum": ["user", "system", "developer", "assistant"]},
            content=_CONTENT,
        ),
        *_call_items("function_call", "arguments"),
        *_call_items("custom_tool_call", "input"),
        object_schema(["type"], type={"const": "reasoning"}, encrypted_content=_STRING),
        object_schema(
            ["type", "tools"],
            type={"const": "additional_tools"},
            role={"const": "developer"},
            tools={"type": "array", "items": TOOL_SCHEMA},
        ),
    ]
}
Input = Annotated[
    str | Annotated[list[dict[str, Any]], Field(max_length=MAX_MESSAGES)],
    WithJsonSchema(
        {
            "anyOf": [
                _STRING,
                {"type": "array", "minItems": 1, "maxItems": MAX_MESSAGES, "items": INPUT_ITEM_SCHEMA},
            ]
        }
    ),
]
ResponsesTools = Annotated[
    Tools, WithJsonSchema({"type": "array", "maxItems": MAX_TOOLS, "items": TOOL_SCHEMA})
]
ToolChoice = Annotated[
    str | dict[str, Any],
    AfterValidator(_tool_choice),
    WithJsonSchema(
        tool_choice_schema(object_schema(["type", "name"], type={"enum": ["function", "custom"]}, name=_NAME))
    ),
]
Include = Annotated[list[str], WithJsonSchema({"type": "array", "items": {"enum": sorted(INCLUDE_VALUES)}})]


class ResponsesRequest(BaseModel):
    # strict types, as OpenAI's: true is not a number, "yes" not a boolean
    model_config = ConfigDict(extra="allow", strict=True)

    model: ModelName | None = None
    input: Input
    include: Include | None = None
    instructions: str | None = None
    max_output_tokens: Integer | None = Field(None, ge=1)
    metadata: dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    previous_response_id: str | None = None
    reasoning: dict[str, Any] | None = Field(None, description="`effort`: none..max (mapped onto GLM's)")
    store: bool = True
    stream: bool = False
    temperature: float | None = Field(None, ge=0, le=2)
    text: Annotated[dict[str, Any], AfterValidator(_text)] | None = None
    tool_choice: ToolChoice | None = None
    tools: ResponsesTools | None = None
    top_p: float | None = Field(None, gt=0, le=1)
    user: str | None = None
