"""Messages ``context_management``: the edits GLM's template can make, made; the others, said.

Anthropic's ``context_management.edits`` (anthropic SDK: ``types/beta/
beta_context_management_config_param.py``) ask the server to trim the history before the model
reads it. ``clear_thinking_20251015`` (``beta_clear_thinking_20251015_edit_param.py``) keeps the
thinking of the most recent assistant turns (``keep``: ``{"type": "thinking_turns", "value": N}``,
by default 1, or ``"all"`` / ``{"type": "all"}``) and removes the rest. GLM's template keeps the
reasoning of the turns after the last user message and drops the earlier ones by itself
(``clear_thinking``, see ``glm/templates/glm53.jinja``); the edit replaces that rule: the reasoning
of the kept turns is rendered, wherever they are, and the older turns' is removed here.
``clear_tool_uses_20250919`` and ``compact_20260112`` rewrite tool results or summarise, which a
template cannot: they are logged as ignored, never refused.
"""

from __future__ import annotations

import logging
from typing import Any

from sparkfold.api.context import CallContext

__all__ = ["CLEAR_THINKING", "apply_clear_thinking", "log_unapplied_edits", "thinking_turns_kept"]

log = logging.getLogger(__name__)

CLEAR_THINKING = "clear_thinking_20251015"
DEFAULT_KEPT = 1  # the API's default keep: the most recent assistant turn


def _edits(context_management: Any) -> list[dict[str, Any]]:
    edits = context_management.get("edits") if isinstance(context_management, dict) else None
    return [edit for edit in edits if isinstance(edit, dict)] if isinstance(edits, list) else []


def thinking_turns_kept(context_management: Any) -> int | None:
    """The assistant turns whose thinking a ``clear_thinking`` edit keeps (``None``: no such edit;
    a very large number: all of them)."""
    for edit in _edits(context_management):
        if edit.get("type") != CLEAR_THINKING:
            continue
        keep = edit.get("keep", {"type": "thinking_turns", "value": DEFAULT_KEPT})
        if keep == "all" or (isinstance(keep, dict) and keep.get("type") == "all"):
            return 2**31
        value = keep.get("value") if isinstance(keep, dict) else None
        return value if isinstance(value, int) and value >= 0 else DEFAULT_KEPT
    return None


def apply_clear_thinking(messages: list[dict[str, Any]], kept: int) -> None:
    """Remove, in place, the reasoning of all but the last ``kept`` assistant turns with reasoning."""
    thinking = [m for m in messages if m.get("role") == "assistant" and m.get("reasoning_content")]
    for message in thinking[: max(len(thinking) - kept, 0)]:
        del message["reasoning_content"]


def log_unapplied_edits(context_management: Any, call: CallContext) -> None:
    """A log line naming the edits this server does not make."""
    others = [str(edit.get("type"))[:64] for edit in _edits(context_management)]
    others = [kind for kind in others if kind != CLEAR_THINKING]
    if others:
        log.info(
            "ignored context_management edits (the prompt template cannot make them)",
            extra={"request_id": call.request_id, "edits": others},
        )
