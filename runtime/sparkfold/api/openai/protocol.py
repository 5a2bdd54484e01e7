"""Wire models of the OpenAI-compatible routes.

Chat and completion requests are the engine protocol's own models (:mod:`sparkfold.protocol`:
spec fields in the order of https://platform.openai.com/docs/api-reference/chat/create, then the
marked extension block); the gateway extends them, never forks them. The tokenizer routes use
vLLM's field names (https://docs.vllm.ai/en/latest/serving/openai_compatible_server.html).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from sparkfold.protocol import ChatCompletionRequest, ChatMessage, CompletionRequest

__all__ = [
    "ChatCompletionRequest",
    "ChatMessage",
    "CompletionRequest",
    "DetokenizeRequest",
    "DetokenizeResponse",
    "ModelCard",
    "ModelList",
    "TokenizeRequest",
    "TokenizeResponse",
]


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow")


class TokenizeRequest(_Request):
    """``POST /tokenize``: either ``prompt`` (raw text) or ``messages`` (rendered like chat)."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool | None = None
    return_token_strs: bool | None = None
    # --- sparkfold extension
    chat_template_kwargs: dict[str, Any] | None = Field(
        None, description="passed to the chat template when `messages` is given"
    )


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(_Request):
    """``POST /detokenize``: token ids back to text."""

    model: str | None = None
    tokens: list[int]


class DetokenizeResponse(BaseModel):
    prompt: str


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "sparkfold"


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
