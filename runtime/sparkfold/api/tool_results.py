"""A tool result must answer a call the conversation made.

A ``tool`` message (Anthropic ``tool_result``, Responses ``function_call_output``) whose id names
no call of an earlier assistant turn would be rendered to the model as a tool's answer all the
same: text that any client field could pass off as a trusted tool's output (a prompt-injection
path). OpenAI, Anthropic and the Responses API each answer such a request with a 400; so do we,
each dialect in its own words, all by :func:`orphan_result`.

Looser than the upstream APIs in one way: the call may be in any earlier assistant turn, not only
the one just before (OpenAI and Anthropic want the result right after its call), so a history that
reorders or interleaves turns still passes, as long as nothing answers a call that was never made.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["orphan_result"]


def orphan_result(messages: Sequence[Mapping[str, Any]]) -> tuple[int, Any] | None:
    """The first ``tool`` message among chat ``messages`` whose ``tool_call_id`` is the id of no
    call of an earlier assistant message: its index and that id (None when it has none); or None."""
    called: set[Any] = set()
    for i, message in enumerate(messages):
        if message.get("role") == "assistant":
            called.update(
                call.get("id") for call in message.get("tool_calls") or () if isinstance(call, Mapping)
            )
        elif message.get("role") == "tool":
            answers = message.get("tool_call_id")
            if answers is None or answers not in called:
                return i, answers
    return None
