"""The demo model's ``<tool_call>`` JSON parser: a reply's calls are bounded as GLM's are."""

from __future__ import annotations

import json
from typing import Any

from sparkfold.engines.output import plain_parser
from sparkfold.engines.template_tools import ToolCallParser
from sparkfold.protocol import ChatCompletionRequest, Delta

TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
    for name in ("get_time", "roll")
]


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def calls_of(deltas: list[Delta]) -> list[tuple[str, str]]:
    return [
        (str(c.function["name"]), str(c.function["arguments"]))
        for d in deltas
        for c in d.tool_calls or []
        if c.function is not None
    ]


def test_a_repeated_call_is_dropped_and_ends_the_reply() -> None:
    parser = ToolCallParser(TOOLS)
    deltas = parser.feed(call("get_time", tz="UTC") + call("roll", sides=6) + call("get_time", tz="UTC"))
    assert calls_of(deltas) == [("get_time", '{"tz": "UTC"}'), ("roll", '{"sides": 6}')]
    assert parser.ended and parser.tool_calls_made
    assert parser.feed(call("roll", sides=20) + "more text") == []  # the reply is over
    assert parser.finish("stop") == []


def test_forced_calls_end_at_the_cap_per_offered_tool() -> None:
    forced = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "x"}], "tools": TOOLS, "tool_choice": "required"}
    )
    parser = plain_parser(forced, per_tool=1)  # 1 x 2 offered tools
    assert calls_of(parser.feed(call("roll", sides=1))) == [("roll", '{"sides": 1}')]
    assert not parser.ended
    assert calls_of(parser.feed(call("roll", sides=2))) == [("roll", '{"sides": 2}')]
    assert parser.ended
    free = ChatCompletionRequest.model_validate({"messages": forced.model_dump()["messages"], "tools": TOOLS})
    unbounded = plain_parser(free, per_tool=1)  # not forced: only a repeat ends it
    unbounded.feed(call("roll", sides=1) + call("roll", sides=2) + call("roll", sides=3))
    assert not unbounded.ended


def test_text_and_calls_to_tools_not_offered_stay_text() -> None:
    parser = ToolCallParser(TOOLS)
    out = parser.feed("Hi " + call("launch", target="moon")) + parser.finish("stop")
    assert "".join(d.content or "" for d in out) == "Hi " + call("launch", target="moon")
    assert not parser.tool_calls_made and not parser.ended
