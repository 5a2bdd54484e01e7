"""OpenAI Responses through the gateway with the official openai SDK (scripted engine)."""

from __future__ import annotations

import json
import typing

import openai
import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import BaseModel
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
    assert [m["role"] for m in sent] == ["user", "assistant", "user"]  # instructions not carried over
    assert sent[1]["content"] == "Hi!"

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


def test_a_stream_cut_by_max_output_tokens_ends_with_response_incomplete(
    gateway: Running, fake: ScriptedEngine
) -> None:
    """The API's terminal event follows the response's status: ``response.incomplete`` for a reply
    cut by the budget (openai SDK: types/responses/response_incomplete_event.py), never
    ``response.completed`` saying ``incomplete``."""
    fake.queue(Script(content=["a", "b"], finish_reason="length"))
    events = list(client(gateway).responses.create(model="fake", input="x", max_output_tokens=2, stream=True))
    last = events[-1]
    assert "response.completed" not in [e.type for e in events]
    assert last.type == "response.incomplete"
    assert last.response.status == "incomplete"
    assert last.response.incomplete_details is not None
    assert last.response.incomplete_details.reason == "max_output_tokens"


def test_unknown_include_value_is_400(gateway: Running) -> None:
    with pytest.raises(openai.BadRequestError, match="include"):
        client(gateway).responses.create(model="fake", input="x", include=["bogus"])  # type: ignore[list-item]


def test_unknown_previous_response_is_404(gateway: Running) -> None:
    with pytest.raises(openai.NotFoundError):
        client(gateway).responses.create(model="fake", input="x", previous_response_id="resp_nope")


SHELL = [{"type": "function", "name": "shell", "parameters": {"type": "object", "properties": {}}}]
PIXEL = "data:image/png;base64,iVBORw0KGgo="


def test_function_call_output_parts_reach_the_model_as_text_and_pictures(
    gateway: Running, fake: ScriptedEngine
) -> None:
    """The SDK types a function call's output as a string or input_text / input_image parts."""
    client(gateway).responses.create(
        model="fake",
        input=[
            {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{}"},
            {
                "type": "function_call_output",
                "call_id": "c1",
                "output": [
                    {"type": "input_text", "text": "a.txt"},
                    {"type": "input_image", "image_url": PIXEL},
                    {"type": "input_text", "text": "b.txt"},
                ],
            },
        ],
        tools=SHELL,  # type: ignore[arg-type]
    )
    sent = fake.requests[-1]["messages"]
    assert sent[1] == {"role": "tool", "tool_call_id": "c1", "content": "a.txt\nb.txt"}
    assert sent[2] == {"role": "user", "content": [{"type": "image_url", "image_url": {"url": PIXEL}}]}
    with pytest.raises(openai.BadRequestError, match=r"input\[1\]\.output\[0\]"):
        client(gateway).responses.create(
            model="fake",
            input=[
                {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_file"}]},
            ],
        )


def test_reasoning_items_sent_back_reach_the_model(gateway: Running, fake: ScriptedEngine) -> None:
    """A stateless client (``store: false``, as Codex runs) sends the reply's items back as input."""
    fake.queue(Script(reasoning=["plan"], content=["Listing."], tool_calls=[("shell", "{}")]))
    api = client(gateway).responses
    reply = api.create(model="fake", input="list files", tools=SHELL, store=False)  # type: ignore[arg-type]
    assert [item.type for item in reply.output] == ["reasoning", "message", "function_call"]
    echoed = [item.model_dump(exclude_none=True) for item in reply.output]
    api.create(
        model="fake",
        input=[
            {"role": "user", "content": "list files"},
            *echoed,  # type: ignore[list-item]
            {"type": "function_call_output", "call_id": reply.output[2].call_id, "output": "a.txt"},  # type: ignore[union-attr]
        ],
        tools=SHELL,  # type: ignore[arg-type]
        store=False,
    )
    sent = fake.requests[-1]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool"]
    assert sent[1]["reasoning_content"] == "plan" and sent[1]["content"] == "Listing."
    assert [call["function"]["name"] for call in sent[1]["tool_calls"]] == ["shell"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_stored_reply_keeps_its_reasoning(gateway: Running, fake: ScriptedEngine, stream: bool) -> None:
    fake.queue(Script(reasoning=["think"], content=["Hi"]))
    api = client(gateway).responses
    if stream:
        with api.stream(model="fake", input="hello") as events:
            first_id = events.get_final_response().id
    else:
        first_id = api.create(model="fake", input="hello").id
    api.create(model="fake", input="more", previous_response_id=first_id)
    assert fake.requests[-1]["messages"][1] == {
        "role": "assistant",
        "content": "Hi",
        "reasoning_content": "think",
    }


def _event_types() -> dict[str, type[BaseModel]]:
    """The openai SDK's model of each Responses stream event, by its ``type``."""
    members = typing.get_args(typing.get_args(ResponseStreamEvent)[0])
    return {typing.get_args(cls.model_fields["type"].annotation)[0]: cls for cls in members}


@pytest.mark.parametrize("script", ["reply", "failure"])
def test_every_event_and_reply_has_the_fields_the_sdk_requires(
    gateway: Running, fake: ScriptedEngine, script: str
) -> None:
    """Strictly typed clients (a Rust or TypeScript schema) need every required field; the Python
    SDK builds its objects without checking them, so a missing one is only found by reading it
    (``event.name`` of ``function_call_arguments.done`` was None)."""
    fake.queue(
        Script(reasoning=["r"], content=["Hi"], tool_calls=[("shell", "{}")])
        if script == "reply"
        else Script(content=["a", "b"], error_after=1)
    )
    models, seen = _event_types(), []
    body = {"model": "fake", "input": "x", "stream": True, "tools": SHELL}
    with gateway.http.stream("POST", "/v1/responses", json=body) as reply:
        for line in reply.iter_lines():
            if line.startswith("data: "):
                event = json.loads(line.removeprefix("data: "))
                models[event["type"]].model_validate(event)  # raises naming a missing field
                seen.append(event["type"])
    assert seen[-1] == ("response.completed" if script == "reply" else "response.failed")
    fake.queue(Script(reasoning=["r"], content=["Hi"], tool_calls=[("shell", "{}")]))
    Response.model_validate(gateway.http.post("/v1/responses", json={**body, "stream": False}).json())


def test_instructions_are_not_carried_over_to_a_continuation(gateway: Running, fake: ScriptedEngine) -> None:
    """OpenAI: "When using along with previous_response_id, the instructions from a previous
    response will not be carried over to the next response" (the ``instructions`` field of
    https://platform.openai.com/docs/api-reference/responses/create). Clients that send their
    instructions every turn (agent frameworks) had them pile up mid-conversation, once a turn."""
    fake.queue(Script(content=["a"]), Script(content=["b"]), Script(content=["c"]))
    api = client(gateway).responses
    first = api.create(model="fake", input="one", instructions="be brief")
    second = api.create(model="fake", input="two", instructions="be terse", previous_response_id=first.id)
    assert fake.requests[-1]["messages"] == [
        {"role": "system", "content": "be terse"},
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "a"},
        {"role": "user", "content": "two"},
    ]
    api.create(model="fake", input="three", previous_response_id=second.id)
    assert [m["content"] for m in fake.requests[-1]["messages"]] == ["one", "a", "two", "b", "three"]
