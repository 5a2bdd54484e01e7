"""Reasoning controls: every spelling clients use, mapped onto what GLM knows.

GLM's template knows three efforts (``low``, ``high``, ``max``) and thinking on or off.
``reasoning_effort`` (top level, or in ``chat_template_kwargs``, or ``reasoning.effort``) takes
the OpenAI names too: ``minimal`` -> low, ``medium`` -> high, ``xhigh`` -> max, and ``none``
turns thinking off. ``chat_template_kwargs.thinking`` and a top-level ``thinking`` (``true`` /
``false`` or ``{"type": "enabled" | "disabled"}``) are aliases of
``chat_template_kwargs.enable_thinking`` when that is absent; other values are logged, not refused.
"""

from __future__ import annotations

import logging
from typing import Any

from sparkfold.api.errors import InvalidRequest
from sparkfold.glm.effort import EFFORTS

__all__ = ["EFFORTS", "ReasoningControls", "reasoning_controls", "resolve_reasoning"]

log = logging.getLogger(__name__)


class ReasoningControls:
    """What to send upstream: ``effort`` (low/high/max or None), ``enable_thinking`` (or None = default)."""

    __slots__ = ("budget", "effort", "enable_thinking")

    def __init__(self, effort: str | None, enable_thinking: bool | None, budget: int | None) -> None:
        self.effort = effort
        self.enable_thinking = enable_thinking
        self.budget = budget

    def __repr__(self) -> str:
        return f"ReasoningControls({self.effort!r}, thinking={self.enable_thinking!r})"


def _thinking_flag(value: Any, where: str) -> tuple[bool | None, int | None]:
    if isinstance(value, bool):
        return value, None
    if isinstance(value, dict) and value.get("type") in ("enabled", "disabled", "adaptive"):
        budget = value.get("budget_tokens")
        return value["type"] != "disabled", budget if isinstance(budget, int) and budget >= 0 else None
    log.info("ignored reasoning control", extra={"field": where, "value": repr(value)[:80]})
    return None, None


def reasoning_controls(
    *,
    reasoning_effort: Any,
    template_kwargs: dict[str, Any],
    thinking: Any = None,
    reasoning: Any = None,
) -> ReasoningControls | InvalidRequest:
    """Resolve the request's reasoning fields, or an error naming the bad field."""
    enable: bool | None = None
    budget: int | None = None
    if isinstance(template_kwargs.get("enable_thinking"), bool):
        enable = template_kwargs["enable_thinking"]
    elif "thinking" in template_kwargs:
        enable, budget = _thinking_flag(template_kwargs["thinking"], "chat_template_kwargs.thinking")
    elif thinking is not None:
        enable, budget = _thinking_flag(thinking, "thinking")

    effort_field, effort = "reasoning_effort", reasoning_effort
    if effort is None and template_kwargs.get("reasoning_effort") is not None:
        effort_field, effort = "chat_template_kwargs.reasoning_effort", template_kwargs["reasoning_effort"]
    if effort is None and isinstance(reasoning, dict) and reasoning.get("effort") is not None:
        effort_field, effort = "reasoning.effort", reasoning["effort"]
    if effort is None:
        return ReasoningControls(None, enable, budget)
    if not isinstance(effort, str) or effort.lower() not in EFFORTS:
        return InvalidRequest(
            f"{effort_field} must be one of {', '.join(EFFORTS)}; got {effort!r}", param=effort_field
        )
    mapped = EFFORTS[effort.lower()]
    if mapped is None:
        return ReasoningControls(None, False, budget)
    return ReasoningControls(None if enable is False else mapped, enable, budget)


def resolve_reasoning(
    body: dict[str, Any], *, thinking: Any = None, reasoning: Any = None
) -> ReasoningControls | InvalidRequest:
    """Rewrite an engine-bound ``body`` (a chat request, or a ``/tokenize`` of one) in place so its
    ``reasoning_effort`` and ``chat_template_kwargs.enable_thinking`` are what the engine reads,
    whatever spelling the client used (``thinking`` and ``reasoning``: the client's extra fields).

    The one place the prompt's switches are decided: a reply and the count of its prompt render
    alike. Returns the controls (a reply also takes their ``budget``), or the error naming the field.
    """
    kwargs = dict(body.get("chat_template_kwargs") or {})
    controls = reasoning_controls(
        reasoning_effort=body.pop("reasoning_effort", None),
        template_kwargs=kwargs,
        thinking=thinking,
        reasoning=reasoning,
    )
    if isinstance(controls, InvalidRequest):
        return controls
    kwargs.pop("thinking", None)
    kwargs.pop("reasoning_effort", None)
    if controls.effort is not None:
        body["reasoning_effort"] = controls.effort
    if controls.enable_thinking is not None:
        kwargs["enable_thinking"] = controls.enable_thinking
    if kwargs:
        body["chat_template_kwargs"] = kwargs
    else:
        body.pop("chat_template_kwargs", None)
    return controls
