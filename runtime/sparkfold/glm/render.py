"""GLM-5.3 prompt rendering: messages and tools in, prompt text out.

A checkpoint's own chat template is used when it ships one (``chat_template.jinja`` or the
``chat_template`` of ``tokenizer_config.json``); otherwise sparkfold's ``templates/glm53.jinja``.
Either way it runs in jinja2's immutable sandbox, on messages normalised first
(:mod:`sparkfold.glm.messages`).

Reasoning effort and thinking follow the reference recipe (``glm.md`` 6): ``medium`` → high,
``xhigh`` → max, unset → max, ``none`` → thinking off. The GLM-5.3 template has no thinking
switch, so thinking off is applied to whatever the template wrote: the effort line is removed
and the generation prompt's ``<think>`` is closed at once (``<think></think>``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from pydantic import BaseModel

from sparkfold.glm.effort import DEFAULT_EFFORT, EFFORTS
from sparkfold.glm.errors import RenderError
from sparkfold.glm.messages import normalise_messages, normalise_tools
from sparkfold.glm.tokens import THINK, THINK_END
from sparkfold.templating import chat_template_environment

__all__ = [
    "PromptOptions",
    "PromptRenderer",
    "RenderedPrompt",
    "default_template",
    "offered_tools",
    "prompt_options",
]

_EFFORT_LINE = re.compile(r"<\|system\|>Reasoning Effort: (?:Low|High|Max)")


@cache
def default_template() -> str:
    """sparkfold's GLM-5.3 template (package data)."""
    return resources.files("sparkfold.glm").joinpath("templates/glm53.jinja").read_text(encoding="utf-8")


@dataclass(frozen=True)
class PromptOptions:
    """How to render: ``effort`` is ``low``, ``high`` or ``max``; ``thinking`` opens ``<think>``."""

    effort: str = "max"
    thinking: bool = True
    clear_thinking: bool = True
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RenderedPrompt:
    text: str
    options: PromptOptions
    tools: list[dict[str, Any]]

    @property
    def thinking(self) -> bool:
        """Whether the reply starts inside a think block (the prompt ends with an open ``<think>``)."""
        return self.text.endswith(THINK)


def _thinking_flag(value: Any) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, Mapping):  # Anthropic / Z.ai style {"type": "enabled"}
        return str(value.get("type", "enabled")) != "disabled"
    return None


def prompt_options(
    reasoning_effort: str | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    *,
    default_thinking: bool = True,
) -> PromptOptions:
    """Resolve a request's effort and thinking switches into :class:`PromptOptions`."""
    kwargs = dict(chat_template_kwargs or {})
    effort_in = reasoning_effort if reasoning_effort is not None else kwargs.pop("reasoning_effort", None)
    kwargs.pop("reasoning_effort", None)
    thinking = default_thinking
    for key in ("enable_thinking", "thinking"):
        flag = _thinking_flag(kwargs.pop(key, None))
        if flag is not None:
            thinking = flag
    effort = str(effort_in).strip().lower() if effort_in is not None else ""
    if effort == "none":
        thinking = False
    clear = kwargs.pop("clear_thinking", True)
    return PromptOptions(
        effort=EFFORTS.get(effort) or DEFAULT_EFFORT,
        thinking=thinking,
        clear_thinking=bool(True if clear is None else clear),
        extra=kwargs,
    )


def offered_tools(tools: Sequence[Mapping[str, Any]] | None, tool_choice: Any = None) -> list[dict[str, Any]]:
    """The tools a request offers the model (none when ``tool_choice`` is ``"none"``)."""
    if tool_choice == "none":
        return []
    return normalise_tools(tools)


def _raise(message: str) -> None:
    raise RenderError(f"the chat template refused the request: {message}", param="messages")


def _environment() -> ImmutableSandboxedEnvironment:
    return chat_template_environment(_raise)


def _checkpoint_template(directory: Path) -> str | None:
    path = directory / "chat_template.jinja"
    if path.is_file():
        return path.read_text(encoding="utf-8")
    config = directory / "tokenizer_config.json"
    if not config.is_file():
        return None
    template = json.loads(config.read_text(encoding="utf-8")).get("chat_template")
    if isinstance(template, list):  # named templates: take "default"
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, Mapping)}
        template = named.get("default")
    return template if isinstance(template, str) and template.strip() else None


class PromptRenderer:
    """Renders chat requests with one compiled template (a checkpoint's, or sparkfold's)."""

    def __init__(self, chat_template: str | None = None) -> None:
        self.own_template = chat_template is None
        source = default_template() if chat_template is None else chat_template
        try:
            self._template = _environment().from_string(source)
        except TemplateError as exc:
            raise RenderError(f"the chat template does not compile: {exc}") from None

    @classmethod
    def for_checkpoint(cls, directory: str | Path) -> PromptRenderer:
        """The checkpoint's own template when it has one, sparkfold's otherwise."""
        return cls(_checkpoint_template(Path(directory)))

    def render(
        self,
        messages: Sequence[Mapping[str, Any] | BaseModel],
        tools: Sequence[Mapping[str, Any]] | None = None,
        options: PromptOptions | None = None,
        *,
        add_generation_prompt: bool = True,
    ) -> str:
        """The prompt text for ``messages`` (normalised first) and the offered ``tools``."""
        options = options or PromptOptions()
        variables = dict(options.extra)
        variables |= {
            "messages": normalise_messages(messages),
            "tools": normalise_tools(tools) or None,
            "add_generation_prompt": add_generation_prompt,
            "reasoning_effort": options.effort,
            "enable_thinking": options.thinking,
            "clear_thinking": options.clear_thinking,
        }
        try:
            text = self._template.render(**variables)
        except RenderError:
            raise
        except (TemplateError, TypeError, ValueError, AttributeError, KeyError) as exc:
            raise RenderError(
                f"the chat template failed on these messages: {exc}", param="messages"
            ) from None
        if not options.thinking:
            text = _EFFORT_LINE.sub("", text, count=1)
            if add_generation_prompt and text.endswith(THINK):
                text += THINK_END
        return text

    def render_request(self, request: Any, *, default_thinking: bool = True) -> RenderedPrompt:
        """Render a :class:`sparkfold.protocol.ChatCompletionRequest` (or anything shaped like it)."""
        options = prompt_options(
            getattr(request, "reasoning_effort", None),
            getattr(request, "chat_template_kwargs", None),
            default_thinking=default_thinking,
        )
        tools = offered_tools(getattr(request, "tools", None), getattr(request, "tool_choice", None))
        text = self.render(request.messages, tools, options)
        return RenderedPrompt(text=text, options=options, tools=tools)
