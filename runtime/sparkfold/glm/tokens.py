"""GLM-5.3 special tokens: their text and their ids in the published vocabulary.

The published checkpoints place every control token in one block that starts at
``<|endoftext|>`` (id 154,820) and runs in the order of :data:`SPECIAL_TOKENS`; the ids the
reference names (section 4 of ``reference/glm.md``) all fall where this order puts them. A
smaller vocabulary (the tiny test model) keeps the same order from its own base id, so
``id - base`` is the same everywhere.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = [
    "ASSISTANT",
    "BEGIN_OF_IMAGE",
    "BEGIN_OF_VIDEO",
    "ENDOFTEXT",
    "END_OF_IMAGE",
    "END_OF_VIDEO",
    "GMASK",
    "IMAGE",
    "OBSERVATION",
    "PUBLISHED_BASE_ID",
    "PUBLISHED_VOCAB_SIZE",
    "SOP",
    "SPECIAL_TOKENS",
    "STOP_TOKENS",
    "SYSTEM",
    "THINK",
    "THINK_END",
    "TOOL_CALL",
    "TOOL_CALL_END",
    "USER",
    "VIDEO",
    "partial_tag",
    "special_token_ids",
]

ENDOFTEXT = "<|endoftext|>"
GMASK = "[gMASK]"
SOP = "<sop>"
SYSTEM = "<|system|>"
USER = "<|user|>"
ASSISTANT = "<|assistant|>"
OBSERVATION = "<|observation|>"
BEGIN_OF_IMAGE = "<|begin_of_image|>"
END_OF_IMAGE = "<|end_of_image|>"
BEGIN_OF_VIDEO = "<|begin_of_video|>"
END_OF_VIDEO = "<|end_of_video|>"
THINK = "<think>"
THINK_END = "</think>"
TOOL_CALL = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
IMAGE = "<|image|>"
VIDEO = "<|video|>"

#: Every control token, in vocabulary order from ``<|endoftext|>``.
SPECIAL_TOKENS: tuple[str, ...] = (
    ENDOFTEXT,  # 154820, also the pad token
    "[MASK]",
    GMASK,
    "[sMASK]",
    SOP,
    "<eop>",
    SYSTEM,
    USER,  # 154827
    ASSISTANT,
    OBSERVATION,  # 154829
    BEGIN_OF_IMAGE,  # 154830
    END_OF_IMAGE,
    BEGIN_OF_VIDEO,  # 154832
    END_OF_VIDEO,
    "<|begin_of_audio|>",
    "<|end_of_audio|>",
    "<|begin_of_transcription|>",
    "<|end_of_transcription|>",
    "<|code_prefix|>",
    "<|code_middle|>",
    "<|code_suffix|>",
    THINK,
    THINK_END,
    TOOL_CALL,  # 154843
    TOOL_CALL_END,
    "<tool_response>",
    "</tool_response>",
    "<arg_key>",  # 154847
    "</arg_key>",
    "<arg_value>",  # 154849
    "</arg_value>",
    "/nothink",
    "<|begin_of_box|>",
    "<|end_of_box|>",
    IMAGE,  # 154854
    VIDEO,  # 154855
)

PUBLISHED_BASE_ID = 154_820
PUBLISHED_VOCAB_SIZE = 154_880

#: Tokens that end a reply: the EOS ids of ``generation_config.json`` plus ``<|assistant|>``
#: (a raw ``<|assistant|>`` in a reply ends it, as the reference recipe does).
STOP_TOKENS: tuple[str, ...] = (ENDOFTEXT, USER, OBSERVATION, ASSISTANT)


def special_token_ids(base: int = PUBLISHED_BASE_ID) -> dict[str, int]:
    """The id of every control token for a vocabulary whose block starts at ``base``."""
    return {token: base + offset for offset, token in enumerate(SPECIAL_TOKENS)}


def partial_tag(text: str, tags: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that could still grow into one of ``tags``."""
    for size in range(min(len(text), max(map(len, tags)) - 1), 0, -1):
        suffix = text[-size:]
        if any(tag.startswith(suffix) for tag in tags):
            return size
    return 0
