"""Prompt rendering with the checkpoint's own chat template, in a sandboxed jinja2 environment.

A chat template is code that came with the weights: it runs in the one sandbox
(:func:`sparkfold.templating.chat_template_environment`). Messages reach it as
:func:`~sparkfold.engines.template_tools.template_messages` writes them (text parts joined; tools
in the ``<tool_call>`` form when the template has no tool format of its own). :class:`ChatRenderer`
is the seam: the GLM renderer in ``sparkfold.glm`` implements the same one method, so the server
never cares which family it serves.
"""

from __future__ import annotations

from typing import Any, NoReturn, Protocol

import jinja2

from sparkfold.engines.template_tools import renders_tools, template_messages
from sparkfold.protocol import ChatCompletionRequest
from sparkfold.templating import chat_template_environment

__all__ = ["ChatRenderer", "ChatTemplateRenderer", "TemplateError"]


class TemplateError(ValueError):
    """The template refused the conversation (``raise_exception``) or failed to render."""


class ChatRenderer(Protocol):
    """Turns a chat request into the prompt text the model continues."""

    def render(self, request: ChatCompletionRequest) -> str: ...


def _raise_exception(message: str) -> NoReturn:
    raise TemplateError(message)


class ChatTemplateRenderer:
    """Renders a Hugging Face style chat template (``tokenizer.chat_template``).

    ``special_tokens`` (``bos_token``, ``eos_token`` …) are passed to the template as variables;
    a request's ``chat_template_kwargs`` are passed too, after ``enable_thinking`` defaults to
    ``thinking``.
    """

    def __init__(self, template: str, special_tokens: dict[str, str], *, thinking: bool = True) -> None:
        env = chat_template_environment(_raise_exception)
        try:
            self._template = env.from_string(template)
        except jinja2.TemplateError as exc:
            raise TemplateError(f"the model's chat template does not compile: {exc}") from None
        self._special = dict(special_tokens)
        self._thinking = thinking
        self.native_tools = renders_tools(template)
        """Whether the template renders ``tools`` itself (else they go in a system message)."""

    def render(self, request: ChatCompletionRequest) -> str:
        tools = request.tools if request.tool_choice != "none" else None
        dumped = [m.model_dump(exclude_none=True) for m in request.messages]
        messages = template_messages(dumped, tools, native_tools=self.native_tools)
        variables: dict[str, Any] = {
            **self._special,
            "messages": messages,
            "add_generation_prompt": True,
            "enable_thinking": self._thinking,
        }
        if tools and self.native_tools:
            variables["tools"] = tools
        variables.update(request.chat_template_kwargs or {})
        try:
            return self._template.render(variables)
        except TemplateError:
            raise
        except (jinja2.TemplateError, TypeError) as exc:  # TypeError: a template adding str and list
            raise TemplateError(f"the chat template could not render these messages: {exc}") from None
