"""The engine protocol's wire models: the one seam between ``api/`` and ``engines/``.

The contract is TensorFold v0.6.0's OpenAI-compatible HTTP API (``docs/engine-protocol.md``).
Request models accept unknown fields (a newer client may send them) and report which ones
were ignored through :func:`ignored_fields`, so a server can log them instead of dropping
them silently. Response models are what an engine server sends and the gateway reads.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
)

__all__ = [
    "IGNORED_SHOWN",
    "MAX_CHOICES",
    "MAX_CONTENT_PARTS",
    "MAX_MESSAGES",
    "MAX_N",
    "MAX_PROMPTS",
    "MAX_STOP",
    "MAX_TOOLS",
    "MAX_TOP_LOGPROBS",
    "SEED_MAX",
    "SEED_MIN",
    "ChatCompletion",
    "ChatCompletionChunk",
    "ChatCompletionRequest",
    "ChatMessage",
    "Choice",
    "ChunkChoice",
    "Completion",
    "CompletionChoice",
    "CompletionRequest",
    "Content",
    "Delta",
    "DetokenizeRequest",
    "DetokenizeResponse",
    "EngineCapabilities",
    "EngineHealth",
    "ErrorInfo",
    "ErrorResponse",
    "FunctionCall",
    "FunctionTools",
    "ModelCard",
    "ModelList",
    "ModelName",
    "PeerState",
    "ProtocolError",
    "Seed",
    "Stop",
    "TokenizeRequest",
    "TokenizeResponse",
    "ToolCall",
    "ToolChoice",
    "Tools",
    "Usage",
    "error_location",
    "field_error",
    "ignored_fields",
    "ignored_summary",
    "new_id",
    "object_schema",
    "read_reply",
    "tool_choice_schema",
]

FinishReason = Literal["stop", "length", "tool_calls", "content_filter", "error", "abort"]


# Bounds on what one request may carry, so its size in memory follows from its size on the wire
# and nothing reaches an engine that a C library cannot hold (a seed past 64 bits ended the
# transformers engine's process). OpenAI documents 128 tools; the rest are generous for a client
# and small for an attacker.
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1
MAX_MESSAGES = 4096
MAX_CONTENT_PARTS = 1024
MAX_TOOLS = 128
MAX_STOP = 16
MAX_CHOICES = 1024
MAX_N = 16  # choices per prompt (``n``)
MAX_PROMPTS = 64  # prompts in one /v1/completions request
MAX_TOP_LOGPROBS = 20


def _integral(value: Any) -> Any:
    """A number without a fraction written as one (``1.0``): JSON Schema's integer, and what
    generated clients send; the strict integer fields take it as the integer it is."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


Integer = Annotated[int, BeforeValidator(_integral)]
"""An integer field of a request: an integer, or a number with no fraction (``1.0``), never
``true`` or ``"1"``."""
Seed = Annotated[Integer, Field(ge=SEED_MIN, le=SEED_MAX, description="64-bit signed integer")]
Stop = str | Annotated[list[str], Field(max_length=MAX_STOP)]
Tools = Annotated[list[dict[str, Any]], Field(max_length=MAX_TOOLS)]


def _function_tool(tool: dict[str, Any]) -> dict[str, Any]:
    """A chat tool is a named function; any other kind (OpenAI's ``custom`` tools, …) is refused,
    never dropped: a model served through its own chat template would be shown nothing."""
    kind = tool.get("type", "function")
    if kind != "function":
        raise ValueError(
            'only function tools are supported ({"type": "function", "function": {"name": ...}}), '
            f"not type {kind!r}"
        )
    function = tool.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
        raise ValueError("a function tool needs function.name (a non-empty string)")
    return tool


def object_schema(required: list[str], **properties: Any) -> dict[str, Any]:
    """A JSON Schema object with ``required`` keys and ``properties`` (the OpenAPI document's
    shapes of the request fields validated by hand)."""
    return {"type": "object", "required": required, "properties": properties}


def tool_choice_schema(named: dict[str, Any]) -> dict[str, Any]:
    """A ``tool_choice`` schema: one of OpenAI's modes, or ``named`` (the object naming a tool)."""
    return {"anyOf": [{"enum": ["none", "auto", "required"]}, named]}


_NAME = {"type": "string", "minLength": 1}
FUNCTION_TOOL_SCHEMA = object_schema(
    ["function"],
    type={"const": "function"},
    function=object_schema(
        ["name"], name=_NAME, description={"type": "string"}, parameters={"type": "object"}
    ),
)
FunctionTools = Annotated[
    list[Annotated[dict[str, Any], AfterValidator(_function_tool), WithJsonSchema(FUNCTION_TOOL_SCHEMA)]],
    Field(max_length=MAX_TOOLS),
]
"""The ``tools`` of a chat request (and of ``/tokenize``): named functions."""
ModelName = Annotated[str, Field(min_length=1)]


def _typed_parts(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A content part's ``type`` is a string where it is given (every reader dispatches on it)."""
    for j, part in enumerate(parts):
        if "type" in part and not isinstance(part["type"], str):
            raise ValueError(f"part {j}: type must be a string such as 'text'")
    return parts


_PARTS_SCHEMA = {
    "type": "array",
    "maxItems": MAX_CONTENT_PARTS,
    "items": {"type": "object", "properties": {"type": {"type": "string"}}},
}
Content = (
    str
    | Annotated[
        list[dict[str, Any]],
        Field(max_length=MAX_CONTENT_PARTS),
        AfterValidator(_typed_parts),
        WithJsonSchema(_PARTS_SCHEMA),
    ]
)


def _tool_choice(value: str | dict[str, Any]) -> str | dict[str, Any]:
    """OpenAI chat's ``tool_choice``: none, auto, required, or a named function."""
    if isinstance(value, str):
        if value not in ("none", "auto", "required"):
            raise ValueError(f"must be none, auto, required or a function object, not {value!r}")
        return value
    function = value.get("function")
    if value.get("type") != "function" or not isinstance(function, dict):
        raise ValueError('an object tool_choice must be {"type": "function", "function": {"name": ...}}')
    if not isinstance(function.get("name"), str) or not function["name"]:
        raise ValueError("tool_choice.function.name must be a non-empty string")
    return value


ToolChoice = Annotated[
    str | dict[str, Any],
    AfterValidator(_tool_choice),
    WithJsonSchema(
        tool_choice_schema(
            object_schema(
                ["type", "function"], type={"const": "function"}, function=object_schema(["name"], name=_NAME)
            )
        )
    ),
]


class _Request(BaseModel):
    """A request body: unknown fields are kept (``model_extra``) so they can be logged.

    Types are strict, as OpenAI's are: ``true`` is not a number, ``"yes"`` not a boolean, ``"1"``
    not an integer (an integer is still a number).
    """

    model_config = ConfigDict(extra="allow", populate_by_name=True, strict=True)


class _Wire(BaseModel):
    model_config = ConfigDict(extra="allow")


def ignored_fields(request: BaseModel) -> list[str]:
    """Names of the fields a request carried that the model does not know."""
    return sorted((request.model_extra or {}).keys())


IGNORED_SHOWN = 8
"""Ignored field names a log line shows (with the count of all): 150,000 made one 2 MB line."""


def ignored_summary(names: list[str]) -> dict[str, Any]:
    """What a log line says about ignored fields: how many, and the first few names (each cut)."""
    return {"count": len(names), "fields": [name[:64] for name in names[:IGNORED_SHOWN]]}


# pydantic names the member of a union each of its errors came from inside ``loc`` ("str",
# "function-after[_typed_parts(), list[dict[str,any]]]", "list[…]"); a client knows only its request's
# fields and indexes, so those names are left out wherever a location is said.
_UNION_MEMBER = re.compile(r"^(str|int|float|bool|none|list|dict)$|[\[(]")


def error_location(error: Mapping[str, Any]) -> str:
    """A pydantic error's field as the request names it (``messages.0.content``): its ``loc``
    dotted, without FastAPI's leading ``body`` and pydantic's names for union members."""
    return ".".join(
        str(p)
        for p in error.get("loc", ())
        if p != "body" and not (isinstance(p, str) and _UNION_MEMBER.search(p))
    )


def field_error(exc: ValidationError) -> str:
    """A validation failure in one line: the first field's dotted path and what is wrong with it."""
    first = exc.errors()[0]
    where = error_location(first)
    return f"{where}: {first['msg']}" if where else str(first["msg"])


W = TypeVar("W", bound=BaseModel)


class ProtocolError(ValueError):
    """An engine's answer that does not follow the engine protocol; the message names the field."""


def read_reply(model: type[W], content: bytes) -> W:
    """An engine's JSON answer as ``model``; :class:`ProtocolError` naming the first bad field."""
    try:
        return model.model_validate_json(content)
    except ValidationError as exc:
        first = exc.errors()[0]
        if first["type"] == "json_invalid":
            raise ProtocolError("the body is not JSON") from None
        raise ProtocolError(field_error(exc)) from None


def new_id(prefix: str = "chatcmpl", sep: str = "-") -> str:
    """A fresh id: OpenAI's ``chatcmpl-…``; Anthropic's are ``msg_…`` / ``toolu_…`` (``sep="_"``)."""
    return f"{prefix}{sep}{uuid.uuid4().hex[:24]}"


# --- requests ---------------------------------------------------------------------------------
# https://platform.openai.com/docs/api-reference/chat/create (spec fields in spec order)


class FunctionCall(_Wire):
    name: str
    arguments: str = Field(description="JSON text of the arguments")


class ToolCall(_Wire):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool", "observation"]
    content: Content | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    # extensions: reasoning of an earlier assistant turn
    reasoning_content: str | None = None


class ChatCompletionRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    model: ModelName | None = None
    frequency_penalty: float | None = None
    logprobs: bool | None = None
    top_logprobs: Integer | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    max_tokens: Integer | None = Field(None, ge=1)
    max_completion_tokens: Integer | None = Field(None, ge=1)
    n: Integer | None = Field(None, ge=1, le=MAX_N)
    presence_penalty: float | None = None
    reasoning_effort: str | None = None
    response_format: dict[str, Any] | None = None
    seed: Seed | None = None
    stop: Stop | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    tools: FunctionTools | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    user: str | None = None

    # --- extensions (TensorFold / vLLM) -----------------------------------------------------
    top_k: Integer | None = Field(None, description="sample from the k likeliest tokens; <= 0 is off")
    min_p: float | None = Field(None, ge=0, le=1, description="drop tokens below min_p x the top probability")
    ignore_eos: bool = Field(False, description="keep generating past end-of-sequence")
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="passed to the chat template (enable_thinking, thinking, clear_thinking)"
    )
    thinking_budget: Integer | None = Field(None, ge=0, description="most reasoning tokens before </think>")
    draft: bool = Field(True, description="false = serial reference decoding (exactness tests)")
    priority: str | None = Field(
        None,
        description='"background" runs after other requests',
        json_schema_extra={"anyOf": [{"enum": ["normal", "background"]}, {"type": "null"}]},
    )
    guided_json: dict[str, Any] | str | None = Field(None, description="constrain output to a JSON schema")
    guided_regex: str | None = Field(None, description="constrain output to a regular expression")
    guided_choice: list[str] | None = Field(
        None, max_length=MAX_CHOICES, description="constrain output to one of these strings"
    )
    guided_grammar: str | None = Field(None, description="constrain output to an EBNF grammar")
    return_token_ids: bool = Field(False, description="add the reply's token ids to the response")

    @property
    def reply_budget(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class CompletionRequest(_Request):
    """``POST /v1/completions``: a raw prompt (text or token ids), no chat template."""

    prompt: (
        str
        | Annotated[list[Integer], Field(min_length=1)]
        | Annotated[list[str], Field(min_length=1, max_length=MAX_PROMPTS)]
        | Annotated[
            list[Annotated[list[Integer], Field(min_length=1)]], Field(min_length=1, max_length=MAX_PROMPTS)
        ]
    ) = Field(description="a text, token ids, or a list of either (one choice each)")
    model: ModelName | None = None
    max_tokens: Integer | None = Field(None, ge=1)
    n: Integer | None = Field(None, ge=1, le=MAX_N)
    seed: Seed | None = None
    stop: Stop | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    logprobs: Integer | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = False
    # extensions
    top_k: Integer | None = None
    min_p: float | None = Field(None, ge=0, le=1)
    ignore_eos: bool = False
    add_special_tokens: bool = Field(False, description="let the tokenizer add BOS and friends")
    return_token_ids: bool = Field(False, description="add the reply's token ids to the response")


# --- responses --------------------------------------------------------------------------------


class PromptTokensDetails(_Wire):
    cached_tokens: int = 0


class CompletionTokensDetails(_Wire):
    reasoning_tokens: int = 0


class Usage(_Wire):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails = Field(default_factory=PromptTokensDetails)
    completion_tokens_details: CompletionTokensDetails = Field(default_factory=CompletionTokensDetails)

    @classmethod
    def of(cls, prompt: int, completion: int, cached: int = 0, reasoning: int = 0) -> Usage:
        return cls(
            prompt_tokens=prompt,
            completion_tokens=completion,
            total_tokens=prompt + completion,
            prompt_tokens_details=PromptTokensDetails(cached_tokens=cached),
            completion_tokens_details=CompletionTokensDetails(reasoning_tokens=reasoning),
        )


class ResponseMessage(_Wire):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None


StopReason = Annotated[str | int | None, Field(description="the stop string that ended the reply (vLLM)")]


class _Reply(_Wire):
    """What every answer of the generating routes shares; each kind names its object and choices."""

    id: str
    object: str
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[Any]
    usage: Usage | None = None
    tensorfold: dict[str, Any] | None = Field(None, description="engine stats block")


class _Choice(_Wire):
    """One choice of an answer: its place, and why it ended (in its last chunk when streamed)."""

    index: int = 0
    logprobs: dict[str, Any] | None = Field(None, description="the tokens' log-probabilities, when asked for")
    finish_reason: FinishReason | None = None
    stop_reason: StopReason = None


class Choice(_Choice):
    message: ResponseMessage


class ChatCompletion(_Reply):
    object: Literal["chat.completion"] = "chat.completion"
    choices: list[Choice]
    usage: Usage


class ToolCallDelta(_Wire):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: dict[str, Any] | None = None


class Delta(_Wire):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChunkChoice(_Choice):
    delta: Delta


class ChatCompletionChunk(_Reply):
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    choices: list[ChunkChoice]


class ErrorInfo(_Wire):
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(_Wire):
    error: ErrorInfo


class PeerState(_Wire):
    rank: int
    state: Literal["ok", "lost", "absent"] = Field(description="absent = single-rank engine")
    last_seen_s: float | None = Field(None, description="seconds since the peer's last heartbeat")


class EngineHealth(_Wire):
    """``GET /health`` of an engine server (TensorFold's counters, sparkfold's peer block).

    Fields not named here (the reference recipe's ``pool_tokens``, ``kept_prompts``, ``spill`` …)
    are kept as they are and shown in the gateway's ``/health``.
    """

    ok: bool
    backend: str
    busy: bool = False
    requests_running: int = 0
    requests_total: int = 0
    prompt_tokens_total: int = 0
    completion_tokens_total: int = 0
    prefill_seconds_total: float = 0.0
    decode_seconds_total: float = 0.0
    cached_tokens_total: int = 0
    rounds_total: int = 0
    drafted_total: int = 0
    accepted_total: int = 0
    context_length: int = 0
    streams: int | dict[str, int] = Field(
        1, description="concurrent streams; the reference recipe's engine: decoding, filling, paused"
    )
    peer: PeerState | None = None
    pool: dict[str, int] | None = None
    """Engines with a shared KV pool: pool, free and kept (reusable) tokens, lanes (exllamav3)."""
    stalled_s: float | None = Field(
        None, description="seconds work has waited without an engine step completing (0: progressing)"
    )


# --- completions, tokenizer, models (engine servers; vLLM field names) --------------------------


class CompletionChoice(_Choice):
    text: str


class Completion(_Reply):
    """``POST /v1/completions`` answer (``object`` is ``text_completion`` for chunks too)."""

    object: Literal["text_completion"] = "text_completion"
    choices: list[CompletionChoice]


class TokenizeRequest(_Request):
    """``POST /tokenize``: a raw ``prompt``, or chat ``messages`` rendered by the chat template."""

    model_config = ConfigDict(
        json_schema_extra={  # exactly one of them (the gateway's check, said in its OpenAPI document)
            "oneOf": [
                {"required": ["prompt"], "properties": {"prompt": {"type": "string"}}},
                {"required": ["messages"], "properties": {"messages": {"type": "array"}}},
            ]
        }
    )

    model: ModelName | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = Field(None, min_length=1, max_length=MAX_MESSAGES)
    tools: FunctionTools | None = Field(None, description="with messages: the tools the prompt offers")
    add_special_tokens: bool = Field(True, description="for a prompt: let the tokenizer add BOS and friends")
    add_generation_prompt: bool = True
    return_token_strs: bool = Field(True, description="add each token's string")
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="with messages: as chat's (enable_thinking, ...): the prompt renders as the reply's"
    )
    reasoning_effort: str | None = Field(None, description="with messages: as chat's (none: thinking off)")


class TokenizeResponse(_Wire):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(_Request):
    model: ModelName | None = None
    tokens: list[Annotated[Integer, Field(ge=0)]]


class DetokenizeResponse(_Wire):
    prompt: str


class EngineCapabilities(_Wire):
    """What an engine server offers beyond TensorFold's contract (its ``/v1/models`` card says)."""

    backend: str
    logprobs: bool = False
    """``logprobs`` / ``top_logprobs`` (chat and completions)."""
    n: bool = True
    """``n > 1``, a list of prompts and ``echo`` on ``/v1/completions``."""


class ModelCard(_Wire):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "sparkfold"
    max_model_len: int | None = None
    capabilities: EngineCapabilities | None = Field(
        None, description="sparkfold: what the engine serving it can do; absent (TensorFold): none of it"
    )


class ModelList(_Wire):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def joined(parts: Iterable[str | None]) -> str:
    return "".join(p for p in parts if p)
