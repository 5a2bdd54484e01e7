from __future__ import annotations

import pytest

from sparkfold.engines.chat_template import ChatTemplateRenderer, TemplateError
from sparkfold.protocol import ChatCompletionRequest


def _request(**extra: object) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], **extra})


def test_renders_messages_and_generation_prompt() -> None:
    template = "{{ bos_token }}{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}" + (
        "{% if add_generation_prompt %}[assistant:{% endif %}"
    )
    assert (
        ChatTemplateRenderer(template, {"bos_token": "<s>"}).render(_request()) == "<s>[user:hi][assistant:"
    )


def test_template_kwargs_and_thinking_default_reach_the_template() -> None:
    template = "{{ enable_thinking }}-{{ extra | default('none') }}"
    renderer = ChatTemplateRenderer(template, {}, thinking=False)
    assert renderer.render(_request()) == "False-none"
    assert renderer.render(_request(chat_template_kwargs={"enable_thinking": True, "extra": 1})) == "True-1"


def test_raise_exception_becomes_template_error() -> None:
    renderer = ChatTemplateRenderer("{{ raise_exception('only one user turn') }}", {})
    with pytest.raises(TemplateError, match="only one user turn"):
        renderer.render(_request())


def test_the_sandbox_refuses_to_reach_python_internals() -> None:
    renderer = ChatTemplateRenderer("{{ messages.__class__.__mro__[1].__subclasses__() }}", {})
    with pytest.raises(TemplateError):
        renderer.render(_request())


def test_the_sandbox_refuses_to_mutate_values() -> None:
    renderer = ChatTemplateRenderer("{% set _ = messages.append(1) %}{{ messages | length }}", {})
    with pytest.raises(TemplateError):
        renderer.render(_request())


def test_a_template_that_does_not_compile_is_refused_up_front() -> None:
    with pytest.raises(TemplateError, match="does not compile"):
        ChatTemplateRenderer("{% for %}", {})
