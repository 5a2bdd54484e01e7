"""OpenAI Responses through the gateway with the official openai SDK (scripted engine)."""

from __future__ import annotations

import openai
import pytest
from tests.fakes.harness import Running
from tests.fakes.scripted_engine import Script, ScriptedEngine


def client(gateway: Running) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)


def test_create_get_continue_delete(gateway: Running, fake: ScriptedEngine) -> None:
    fake.queue(Script(reasoning=["think"], content=["Hi", "!"]))
    api = client(gateway).responses
    first = api.create(model="fake", input="hello", instructions="be brief", reasoning={"effort": "low"})
    assert first.output_text == "Hi!"
    assert [item.type for item in first.output] == ["reasoning", "message"]
    assert first.usage is not None and first.usage.output_tokens == 3
    assert fake.requests[-1]["reasoning_effort"] == "low"
    assert api.retrieve(first.id).id == first.id

    fake.queue(Script(content=["again"]))
    api.create(model="fake", input="more", previous_response_id=first.id)
    sent = fake.requests[-1]["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "user"]
    assert sent[2]["content"] == "Hi!"

    api.delete(first.id)
    with pytest.raises(openai.NotFoundError):
        api.retrieve(first.id)


def test_streamed_text_and_function_call(gateway: Running, fake: ScriptedEngine) -> None:
    fake.queue(Script(content=["a", "b"], tool_calls=[("lookup", '{"q": "x"}')]))
    tools = [{"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}]
    with client(gateway).responses.stream(model="fake", input="x", tools=tools) as stream:  # type: ignore[arg-type]
        kinds = [event.type for event in stream]
        final = stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds and "response.function_call_arguments.done" in kinds
    assert final.output_text == "ab"
    call = final.output[-1]
    assert call.type == "function_call" and call.name == "lookup" and call.arguments == '{"q": "x"}'


def test_unknown_include_value_is_400(gateway: Running) -> None:
    with pytest.raises(openai.BadRequestError, match="include"):
        client(gateway).responses.create(model="fake", input="x", include=["bogus"])  # type: ignore[list-item]


def test_unknown_previous_response_is_404(gateway: Running) -> None:
    with pytest.raises(openai.NotFoundError):
        client(gateway).responses.create(model="fake", input="x", previous_response_id="resp_nope")
