"""Chat completions through the gateway with the official openai SDK, against the scripted engine."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from openai.types import Model
from tests.fakes.harness import Running, settings_for
from tests.fakes.scripted_engine import Script, ScriptedEngine, ServerThread, free_port

from sparkfold.api import create_app

WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "metric": {"type": "boolean"},
            },
        },
    },
}


def client(gateway: Running) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)


def test_non_streamed_reply_carries_content_and_reasoning_alias(
    gateway: Running, fake: ScriptedEngine
) -> None:
    fake.queue(Script(reasoning=["Let", " me"], content=["Hi", "!"]))
    reply = client(gateway).chat.completions.create(
        model="fake", messages=[{"role": "user", "content": "hi"}]
    )
    message = reply.choices[0].message
    assert message.content == "Hi!"
    extra = message.model_extra or {}
    assert extra["reasoning_content"] == "Let me"
    assert extra["reasoning"] == "Let me"
    assert reply.usage is not None and reply.usage.completion_tokens == 4


def test_streamed_reply_relays_every_delta_in_order(gateway: Running, fake: ScriptedEngine) -> None:
    fake.queue(Script(reasoning=["a", "b"], content=["x", "y", "z"]))
    stream = client(gateway).chat.completions.create(
        model="fake", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    content, reasoning, aliases, finish = "", "", "", None
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        aliases += (delta.model_extra or {}).get("reasoning") or ""
        finish = chunk.choices[0].finish_reason or finish
    assert (content, reasoning, aliases, finish) == ("xyz", "ab", "ab", "stop")


def test_offered_tool_call_is_typed_by_its_schema(gateway: Running, fake: ScriptedEngine) -> None:
    fake.queue(
        Script(content=[], tool_calls=[("weather", '{"city": "Oslo", "days": "3", "metric": "true"}')])
    )
    reply = client(gateway).chat.completions.create(
        model="fake", messages=[{"role": "user", "content": "weather?"}], tools=[WEATHER]
    )
    call = reply.choices[0].message.tool_calls[0]  # type: ignore[index]
    assert call.function.name == "weather"  # type: ignore[union-attr]
    assert json.loads(call.function.arguments) == {"city": "Oslo", "days": 3, "metric": True}  # type: ignore[union-attr]
    assert reply.choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize(
    ("tool", "says"),
    [
        ({"type": "custom", "custom": {"name": "shell"}}, "not type 'custom'"),  # openai's custom tools
        ({"type": "function", "function": {"parameters": {}}}, "function.name"),
    ],
)
def test_a_tool_that_is_not_a_named_function_is_refused(
    gateway: Running, fake: ScriptedEngine, tool: dict[str, Any], says: str
) -> None:
    """Not dropped: a model served through its chat template was shown no tool at all."""
    with pytest.raises(openai.BadRequestError) as caught:
        client(gateway).chat.completions.create(
            model="fake",
            messages=[{"role": "user", "content": "x"}],
            tools=[WEATHER, tool],  # type: ignore[list-item]
        )
    assert caught.value.body["param"] == "tools.1"  # type: ignore[index]
    assert says in caught.value.body["message"]  # type: ignore[index]
    assert fake.requests == []


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"functions": [WEATHER["function"]]}, "functions"),  # the deprecated spelling of tools
        ({"functions": [WEATHER["function"]], "function_call": "auto"}, "functions"),
        ({"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"}}, "modalities"),
    ],
)
def test_what_would_be_silently_lost_is_refused(
    gateway: Running, fake: ScriptedEngine, fields: dict[str, Any], param: str
) -> None:
    """Ignoring these (as unknown fields are) answered plain text: a client that offered
    ``functions`` never got a call, one that asked for audio got none."""
    with pytest.raises(openai.BadRequestError) as caught:
        client(gateway).chat.completions.create(
            model="fake", messages=[{"role": "user", "content": "x"}], **fields
        )
    assert caught.value.body["param"] == param  # type: ignore[index]
    assert fake.requests == []
    client(gateway).chat.completions.create(
        model="fake", messages=[{"role": "user", "content": "x"}], modalities=["text"]
    )


@pytest.mark.parametrize("stream", [False, True])
def test_call_to_a_tool_not_offered_comes_back_as_text(
    gateway: Running, fake: ScriptedEngine, stream: bool
) -> None:
    fake.queue(Script(content=["ok "], tool_calls=[("rm_rf", '{"path": "/"}')]))
    messages = [{"role": "user", "content": "x"}]
    api = client(gateway).chat.completions
    if not stream:
        reply = api.create(model="fake", messages=messages, tools=[WEATHER])  # type: ignore[arg-type]
        text, calls, finish = (
            reply.choices[0].message.content,
            reply.choices[0].message.tool_calls,
            reply.choices[0].finish_reason,
        )
    else:
        text, calls, finish = "", None, None
        for chunk in api.create(model="fake", messages=messages, tools=[WEATHER], stream=True):  # type: ignore[arg-type]
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                calls = calls or chunk.choices[0].delta.tool_calls
                finish = chunk.choices[0].finish_reason or finish
    assert calls is None
    assert text is not None and text.startswith("ok <tool_call>") and '"rm_rf"' in text
    assert finish == "stop"


def test_streamed_tool_calls_arrive_name_first_then_arguments_as_written(
    gateway: Running, fake: ScriptedEngine
) -> None:
    fake.queue(
        Script(
            content=[],
            tool_calls=[("weather", '{"city": "Oslo", "days": 2}'), ("weather", '{"city": "Rome"}')],
            tool_pieces=4,
        )
    )
    deltas = []
    finish = None
    for chunk in client(gateway).chat.completions.create(
        model="fake",
        messages=[{"role": "user", "content": "x"}],
        tools=[WEATHER],
        stream=True,  # type: ignore[list-item]
    ):
        if chunk.choices:
            deltas += chunk.choices[0].delta.tool_calls or []
            finish = chunk.choices[0].finish_reason or finish
    assert len(deltas) == 8  # every piece of the arguments as the engine wrote it
    named = [d for d in deltas if d.function and d.function.name]
    assert [(d.index, d.function.name, d.id) for d in named] == [
        (0, "weather", "call_0"),
        (1, "weather", "call_1"),
    ]  # type: ignore[union-attr]
    arguments = {0: "", 1: ""}
    for d in deltas:
        arguments[d.index] += d.function.arguments or ""  # type: ignore[union-attr]
    assert [json.loads(arguments[i]) for i in (0, 1)] == [{"city": "Oslo", "days": 2}, {"city": "Rome"}]
    assert finish == "tool_calls"


def test_error_mid_stream_becomes_error_event_then_done(gateway: Running, fake: ScriptedEngine) -> None:
    fake.queue(Script(content=["a", "b", "c"], error_after=2))
    body = {"model": "fake", "messages": [{"role": "user", "content": "x"}], "stream": True}
    with gateway.http.stream("POST", "/v1/chat/completions", json=body) as response:
        events = [line for line in response.iter_lines() if line.startswith("data:")]
    assert response.status_code == 200
    assert json.loads(events[-2].removeprefix("data:"))["error"]["message"] == "scripted failure"
    assert events[-1] == "data: [DONE]"


def test_stream_cut_without_done_gets_an_error_event(gateway: Running, fake: ScriptedEngine) -> None:
    fake.queue(Script(content=["a", "b", "c"], drop_after=1))
    body = {"model": "fake", "messages": [{"role": "user", "content": "x"}], "stream": True}
    with gateway.http.stream("POST", "/v1/chat/completions", json=body) as response:
        events = [line for line in response.iter_lines() if line.startswith("data:")]
    assert "before it finished" in json.loads(events[-2].removeprefix("data:"))["error"]["message"]
    assert events[-1] == "data: [DONE]"


def test_engine_refusal_keeps_its_status_and_message(gateway: Running, fake: ScriptedEngine) -> None:
    fake.queue(Script(status=400))
    with pytest.raises(openai.BadRequestError) as caught:
        client(gateway).chat.completions.create(
            model="fake", messages=[{"role": "user", "content": "x"}], stream=True
        )
    assert "scripted refusal" in str(caught.value)


def test_unreachable_engine_is_a_503_not_a_500() -> None:
    app = create_app(settings_for(free_port()))
    with ServerThread(app) as server:
        response = httpx.post(
            server.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}
        )
        assert response.status_code == 503
        assert response.headers["retry-after"] == "5"  # the unit restarts the engine: ask again
        assert "cannot reach the engine" in response.json()["error"]["message"]
        health = httpx.get(server.url + "/health")
        assert health.status_code == 503 and health.json()["engine"]["ok"] is False


def test_unknown_fields_are_dropped_and_not_sent_upstream(gateway: Running, fake: ScriptedEngine) -> None:
    body = {"model": "fake", "messages": [{"role": "user", "content": "x"}], "frobnicate": 1}
    assert gateway.http.post("/v1/chat/completions", json=body).status_code == 200
    assert "frobnicate" not in fake.requests[-1]


def test_a_gateway_bug_is_a_json_500_with_the_request_id(
    gateway: Running, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(gateway.app.gateway.chat, "prepare", broken)
    response = gateway.http.post(
        "/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]}
    )
    assert response.status_code == 500
    assert response.headers["x-request-id"] in response.json()["error"]["message"]
    assert gateway.http.get("/health").status_code == 200  # still serving


def test_model_list_and_card_have_the_fields_the_sdk_requires(gateway: Running) -> None:
    """TensorFold's cards (and the scripted engine's) carry no ``created``; OpenAI's ``Model``
    requires it, and strictly typed clients refuse a list without it."""
    listed = gateway.http.get("/v1/models").json()
    for card in listed["data"]:
        Model.model_validate(card)
    Model.model_validate(gateway.http.get("/v1/models/fake").json())
    assert [model.id for model in client(gateway).models.list()] == ["fake"]
