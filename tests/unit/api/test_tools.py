"""Tool-call hygiene: typed arguments where unambiguous, unoffered calls as text."""

from __future__ import annotations

import json

import pytest

from sparkfold.api.tools import Toolbox

SCHEMA = {
    "type": "object",
    "properties": {
        "n": {"type": "integer"},
        "x": {"type": "number"},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "integer"}},
        "opts": {"type": "object", "properties": {"depth": {"type": "integer"}}},
        "name": {"type": "string"},
        "either": {"type": ["integer", "string"]},
        "nothing": {"type": "null"},
    },
}
BOX = Toolbox([{"type": "function", "function": {"name": "f", "parameters": SCHEMA}}])


@pytest.mark.parametrize(
    ("given", "typed"),
    [
        ({"n": "3"}, {"n": 3}),
        ({"n": "3.0"}, {"n": 3}),
        ({"n": 4.0}, {"n": 4}),
        ({"n": "three"}, {"n": "three"}),
        ({"x": "2.5"}, {"x": 2.5}),
        ({"x": "nan"}, {"x": "nan"}),
        ({"ok": "true"}, {"ok": True}),
        ({"ok": "yes"}, {"ok": "yes"}),
        ({"tags": '[1, "2"]'}, {"tags": [1, 2]}),
        ({"opts": '{"depth": "5"}'}, {"opts": {"depth": 5}}),
        ({"name": 7}, {"name": "7"}),
        ({"either": "7"}, {"either": "7"}),  # a union is ambiguous: left alone
        ({"nothing": "null"}, {"nothing": None}),
        ({"unknown": "1"}, {"unknown": "1"}),
    ],
)
def test_arguments_are_typed_by_the_schema(given: dict[str, object], typed: dict[str, object]) -> None:
    assert json.loads(BOX.typed_arguments("f", json.dumps(given))) == typed


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
