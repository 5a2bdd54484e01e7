"""Tool calls as another engine streams them (TensorFold's way, played by the scripted engine: name
first, then the arguments in pieces), relayed piece by piece on Anthropic Messages and Responses,
and a call cut by ``max_tokens`` returned partial there, through the anthropic and openai SDKs."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import pytest
from tests.fakes.harness import Running
from tests.fakes.scripted_engine import Script, ScriptedEngine
from tests.fakes.sdk_events import input_json_pieces

ARGUMENTS = '{"path": "a.txt", "content": "one two three four five"}'
CUT = '{"path": "a.txt", "content": "one two'
SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": "string"}}}
ASK: Any = [{"role": "user", "content": "write it"}]
CLAUDE_TOOLS: Any = [{"name": "write_file", "input_schema": SCHEMA}]
RESPONSES_TOOLS: Any = [{"type": "function", "name": "write_file", "parameters": SCHEMA}]


def claude(gateway: Running) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0)


def oai(gateway: Running) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)


def test_anthropic_relays_each_piece_as_an_input_json_delta(gateway: Running, fake: ScriptedEngine) -> None:
    fake.queue(Script(content=[], tool_calls=[("write_file", ARGUMENTS)], tool_pieces=6))
    with claude(gateway).messages.stream(
        model="fake", max_tokens=64, messages=ASK, tools=CLAUDE_TOOLS
    ) as stream:
        events = list(stream)
        final = stream.get_final_message()
    pieces = input_json_pieces(events)
    assert len(pieces) == 6 and "".join(pieces) == ARGUMENTS
    assert final.content[-1].type == "tool_use" and final.content[-1].input == json.loads(ARGUMENTS)


def test_responses_relays_each_piece_as_an_arguments_delta(gateway: Running, fake: ScriptedEngine) -> None:
    fake.queue(Script(content=[], tool_calls=[("write_file", ARGUMENTS)], tool_pieces=6))
    events = list(oai(gateway).responses.create(model="fake", input=ASK, tools=RESPONSES_TOOLS, stream=True))
    pieces = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(pieces) == 6 and "".join(pieces) == ARGUMENTS


@pytest.mark.parametrize("stream", [False, True])
def test_a_cut_call_is_a_partial_tool_use(gateway: Running, fake: ScriptedEngine, stream: bool) -> None:
    fake.queue(Script(content=[], tool_calls=[("write_file", CUT)], tool_pieces=3, finish_reason="length"))
    body: Any = {"model": "fake", "max_tokens": 64, "messages": ASK, "tools": CLAUDE_TOOLS}
    if stream:
        with claude(gateway).messages.stream(**body) as events:
            message = events.get_final_message()
        expected = {"path": "a.txt"}  # the SDK's own reading of the unfinished JSON drops a cut string
    else:
        message = claude(gateway).messages.create(**body)
        expected = {"path": "a.txt", "content": "one two"}
    (use,) = message.content
    assert use.type == "tool_use" and use.input == expected and message.stop_reason == "max_tokens"


@pytest.mark.parametrize("stream", [False, True])
def test_a_cut_call_is_an_incomplete_function_call(
    gateway: Running, fake: ScriptedEngine, stream: bool
) -> None:
    fake.queue(Script(content=[], tool_calls=[("write_file", CUT)], tool_pieces=3, finish_reason="length"))
    body: Any = {"model": "fake", "input": ASK, "tools": RESPONSES_TOOLS, "max_output_tokens": 64}
    if stream:
        response = list(oai(gateway).responses.create(**body, stream=True))[-1].response  # type: ignore[union-attr]
    else:
        response = oai(gateway).responses.create(**body)
    (call,) = response.output
    assert call.type == "function_call" and (call.arguments, call.status) == (CUT, "incomplete")
    assert response.status == "incomplete"
