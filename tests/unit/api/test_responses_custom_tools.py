"""Responses ``custom`` (freeform) tools and ``additional_tools`` input items, as Codex CLI
(0.171.0) sends them on its own default model: every tool inside an ``additional_tools`` item, its
shell as ``exec``, a custom tool of its ``functions`` namespace whose input is JavaScript under a
Lark grammar. Through the gateway with the official openai SDK; the scripted engine stands in for
the model.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
import xgrammar as xgr
from tests.fakes.harness import Running
from tests.fakes.scripted_engine import Script, ScriptedEngine
from xgrammar.testing import _is_grammar_accept_string

from sparkfold.api.responses.tools import responses_tools
from sparkfold.glm.grammar import constraint_from_request
from sparkfold.protocol import ChatCompletionRequest

EXEC_GRAMMAR = "start: SOURCE\nSOURCE: /[\\s\\S]+/\n"
EXEC: dict[str, Any] = {
    "type": "custom",
    "name": "exec",
    "description": "Run JavaScript",
    "format": {"type": "grammar", "syntax": "lark", "definition": EXEC_GRAMMAR},
}
ADDITIONAL_TOOLS = {
    "type": "additional_tools",
    "id": "at_1",
    "role": "developer",
    "tools": [
        {
            "type": "namespace",
            "name": "functions",
            "description": "",
            "tools": [EXEC, {"type": "function", "name": "wait", "parameters": {"type": "object"}}],
        }
    ],
}
SCRIPT = 'const ran = await tools.exec_command({cmd: "ls"});\ntext(ran.output);'


def client(gateway: Running) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway.url + "/v1", api_key="unused", max_retries=0)


def default_model_request(*items: dict[str, Any], **fields: Any) -> dict[str, Any]:
    """Codex's first request on its default model: no ``tools``, an ``additional_tools`` item."""
    user = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list files"}]}
    return {
        "model": "fake",
        "input": [ADDITIONAL_TOOLS, user, *items],
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "store": False,
        "include": ["reasoning.encrypted_content"],
        **fields,
    }


@pytest.mark.parametrize("stream", [False, True])
def test_a_custom_tool_of_additional_tools_is_offered_and_its_call_is_a_custom_tool_call(
    gateway: Running, fake: ScriptedEngine, stream: bool
) -> None:
    fake.queue(Script(content=[], tool_calls=[("functions.exec", json.dumps({"input": SCRIPT}))]))
    reply: Any = client(gateway).responses.create(**default_model_request(stream=stream))
    if stream:
        events = list(reply)
        types = [event.type for event in events]
        assert types[-1] == "response.completed"
        delta, done = (e for e in events if e.type.startswith("response.custom_tool_call_input."))
        assert (delta.delta, done.input) == (SCRIPT, SCRIPT)
        assert "response.function_call_arguments.delta" not in types
        reply = events[-1].response
    offered = {tool["function"]["name"]: tool["function"] for tool in fake.requests[-1]["tools"]}
    assert sorted(offered) == ["functions.exec", "functions.wait"]
    parameters = offered["functions.exec"]["parameters"]
    assert parameters["required"] == ["input"] and parameters["properties"]["input"]["type"] == "string"
    assert EXEC_GRAMMAR in parameters["properties"]["input"]["description"]  # shown to the model
    assert [m["role"] for m in fake.requests[-1]["messages"]] == ["user"]
    (call,) = reply.output
    assert call.type == "custom_tool_call"
    assert (call.name, call.namespace, call.input) == ("exec", "functions", SCRIPT)


def test_a_custom_call_and_its_output_sent_back_are_the_function_call_and_its_result(
    gateway: Running, fake: ScriptedEngine
) -> None:
    call = {
        "type": "custom_tool_call",
        "call_id": "call_1",
        "name": "exec",
        "namespace": "functions",
        "input": SCRIPT,
    }
    output = {"type": "custom_tool_call_output", "call_id": "call_1", "output": "hello.txt"}
    fake.queue(Script(content=["Done."]))
    reply = client(gateway).responses.create(**default_model_request(call, output))
    assert reply.output_text == "Done."
    _user, assistant, tool = fake.requests[-1]["messages"]
    (sent,) = assistant["tool_calls"]
    assert sent["function"]["name"] == "functions.exec"
    assert json.loads(sent["function"]["arguments"]) == {"input": SCRIPT}
    assert (tool["tool_call_id"], tool["content"]) == ("call_1", "hello.txt")


def regex_tool() -> dict[str, Any]:
    return {
        "type": "custom",
        "name": "pick",
        "format": {"type": "grammar", "syntax": "regex", "definition": "[a-c]+"},
    }


def test_a_forced_custom_call_is_held_to_its_regex(gateway: Running, fake: ScriptedEngine) -> None:
    """A ``regex`` format is the ``input`` parameter's pattern: the forced call's grammar (built as
    the engines build it; here in the JSON ``<tool_call>`` form, which needs no tokenizer) takes an
    input that matches and refuses one that does not."""
    fake.queue(Script(content=[], tool_calls=[("pick", '{"input": "abc"}')]))
    reply = client(gateway).responses.create(
        model="fake", input="pick", tools=[regex_tool()], tool_choice={"type": "custom", "name": "pick"}
    )
    assert reply.output[0].type == "custom_tool_call" and reply.output[0].input == "abc"
    sent = fake.requests[-1]
    assert sent["tool_choice"] == {"type": "function", "function": {"name": "pick"}}
    constraint = constraint_from_request(ChatCompletionRequest.model_validate(sent), "qwen_3")
    assert constraint is not None
    grammar = xgr.Grammar.from_structural_tag(constraint.value)
    call = '<tool_call>\n{{"name": "pick", "arguments": {{"input": "{}"}}}}\n</tool_call>'
    assert _is_grammar_accept_string(grammar, call.format("abcab"))
    assert not _is_grammar_accept_string(grammar, call.format("abd"))


def test_a_lark_grammar_is_said_to_go_unenforced() -> None:
    tools = responses_tools(None, [ADDITIONAL_TOOLS])
    assert not isinstance(tools, Exception)
    assert tools.unenforced == ["functions.exec"]
    assert responses_tools([regex_tool()]).unenforced == []  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("tools", "where"),
    [
        (
            [
                {
                    "type": "custom",
                    "name": "x",
                    "format": {"type": "grammar", "syntax": "ebnf", "definition": "a"},
                }
            ],
            r"tools\[0\]\.format",
        ),
        ([{"type": "custom", "name": "x", "format": {"type": "json"}}], r"tools\[0\]\.format"),
        ([{"type": "custom"}], r"tools\[0\]: a custom tool needs a name"),
    ],
)
def test_a_malformed_custom_tool_is_a_400_naming_it(gateway: Running, tools: Any, where: str) -> None:
    with pytest.raises(openai.BadRequestError, match=where):
        client(gateway).responses.create(model="fake", input="x", tools=tools)


def test_an_additional_tools_item_of_another_role_is_a_400(gateway: Running) -> None:
    item = {**ADDITIONAL_TOOLS, "role": "user"}
    with pytest.raises(openai.BadRequestError, match=r"input\[0\]: an additional_tools item needs role"):
        client(gateway).responses.create(**default_model_request() | {"input": [item]})
