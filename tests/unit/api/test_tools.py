"""Tool-call hygiene: typed arguments where unambiguous, unoffered calls as text."""

from __future__ import annotations

import json

from sparkfold.api.tools import Toolbox

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}, "name": {"type": "string"}}}
BOX = Toolbox([{"type": "function", "function": {"name": "f", "parameters": SCHEMA}}])


def test_arguments_are_fitted_to_the_schema() -> None:  # the rule itself: tests/unit/glm/test_arguments.py
    assert json.loads(BOX.typed_arguments("f", '{"n": "3", "name": 7}')) == {"n": 3, "name": "7"}
    assert BOX.typed_arguments("f", '{"n": 3}') == '{"n": 3}'  # nothing to repair: the engine's own text


def test_arguments_that_are_not_an_object_are_left_alone() -> None:
    assert BOX.typed_arguments("f", "[1, 2]") == "[1, 2]"
    assert BOX.typed_arguments("f", "not json") == "not json"


def test_unoffered_calls_become_text_and_finish_reason_stop() -> None:
    choice = {
        "message": {
            "content": "",
            "tool_calls": [
                {"id": "1", "type": "function", "function": {"name": "f", "arguments": '{"n": "1"}'}},
                {"id": "2", "type": "function", "function": {"name": "evil", "arguments": "{}"}},
            ],
        },
        "finish_reason": "tool_calls",
    }
    BOX.clean_message(choice)
    assert [c["function"]["name"] for c in choice["message"]["tool_calls"]] == ["f"]  # type: ignore[index]
    assert choice["message"]["content"] == '<tool_call>{"name": "evil", "arguments": {}}</tool_call>'  # type: ignore[index]
    assert choice["finish_reason"] == "tool_calls"
    only_evil = {
        "message": {"tool_calls": [{"function": {"name": "evil", "arguments": "{}"}}]},
        "finish_reason": "tool_calls",
    }
    BOX.clean_message(only_evil)
    assert "tool_calls" not in only_evil["message"] and only_evil["finish_reason"] == "stop"  # type: ignore[operator]
