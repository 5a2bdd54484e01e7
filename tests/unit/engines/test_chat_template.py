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


@pytest.mark.parametrize("kind", ["bogus", "image_url", "input_audio"])
def test_the_demo_engine_answers_a_part_it_cannot_read_with_a_400_as_the_glm_engine(kind: str) -> None:
    # main: /tokenize dropped the part and counted the rest (200); the GLM engine answers 400
    from fastapi.testclient import TestClient
    from tests.fakes.fake_engine import FakeGenerator

    from sparkfold.engines.server import create_app
    from sparkfold.engines.service import EngineService

    renderer = ChatTemplateRenderer("{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}", {})
    service = EngineService(FakeGenerator(), served_name="demo", max_tokens=8, renderer=renderer)
    client = TestClient(create_app(service))
    content = [{"type": "text", "text": "hi"}, {"type": kind, kind: {"url": "x"}}]
    body = {"model": "demo", "messages": [{"role": "user", "content": content}]}
    for path in ("/tokenize", "/v1/chat/completions"):
        response = client.post(path, json=body)
        assert response.status_code == 400, (path, response.text)
        error = response.json()["error"]
        assert error["param"].startswith("messages[0].content[1]"), error
        assert kind in error["message"] or "vision" in error["message"], error
    assert (
        client.post("/tokenize", json={"messages": [{"role": "user", "content": content[:1]}]}).status_code
        == 200
    )
