"""Wire models of the OpenAI-compatible routes.

They are the engine protocol's own models (:mod:`sparkfold.protocol`), re-exported here so each
dialect has one place to look: chat and completion requests (spec fields in the order of
https://platform.openai.com/docs/api-reference/chat/create, then the marked extension block), the
tokenizer routes with vLLM's field names
(https://docs.vllm.ai/en/latest/serving/openai_compatible_server.html), and the model list. The
gateway extends them, never forks them.
"""

from __future__ import annotations

from sparkfold.protocol import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    DetokenizeRequest,
    DetokenizeResponse,
    ModelCard,
    ModelList,
    TokenizeRequest,
    TokenizeResponse,
)

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
