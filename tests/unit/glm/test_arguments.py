"""Tool-call argument values typed by the offered schema: GLM's raw text, and any engine's JSON."""

from __future__ import annotations

from typing import Any

import pytest

from sparkfold.glm.arguments import coerce_arguments, coerce_value, repair_arguments


@pytest.mark.parametrize(
    ("text", "schema", "expected"),
    [
        ("42", {"type": "string"}, "42"),
        ("42", {"type": "integer"}, 42),
        ("4.0", {"type": "integer"}, 4),
        ("2.5", {"type": "number"}, 2.5),
        ("true", {"type": "boolean"}, True),
        ("False", {"type": "boolean"}, False),
        ("null", {"type": ["string", "null"]}, None),
        ("hello", {"type": ["string", "null"]}, "hello"),
        ("[1, 2]", {"type": "array"}, [1, 2]),
        ('{"a": {"b": [true]}}', {"type": "object"}, {"a": {"b": [True]}}),
        ("7", {"anyOf": [{"type": "integer"}, {"type": "string"}]}, 7),
        ("seven", {"oneOf": [{"type": "integer"}, {"type": "string"}]}, "seven"),
        ("1", {"enum": ["1", "2"]}, "1"),
        ("3", {"enum": [1, 2, 3]}, 3),
        ("\nC\n", {"type": "string", "enum": ["C", "F"]}, "C"),  # whitespace a grammar allowed
        ("ab cd \r", {"type": "string", "maxLength": 6}, "ab cd"),
        (" ab ", {"type": "string"}, " ab "),
        ("not json", {"type": "integer"}, "not json"),
        ('"quoted"', {"type": "string"}, '"quoted"'),
        ("12", None, 12),
        ("plain words", None, "plain words"),
        ('"json string"', None, '"json string"'),
        ("{}", {"properties": {}}, {}),
    ],
)
def test_values_are_typed_by_their_schema(text: str, schema: Any, expected: Any) -> None:
    value = coerce_value(text, schema)
    assert value == expected and type(value) is type(expected)


def test_arguments_use_the_tool_parameters() -> None:
    parameters = {"type": "object", "properties": {"n": {"type": "integer"}, "s": {"type": "string"}}}
    assert coerce_arguments({"n": "3", "s": "3", "x": "[1]"}, parameters) == {"n": 3, "s": "3", "x": [1]}
    assert coerce_arguments({"n": "3"}, None) == {"n": 3}


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
        "maybe": {"type": ["integer", "null"]},
        "flag": {"anyOf": [{"type": "boolean"}, {"type": "integer"}]},
        "nothing": {"type": "null"},
    },
}


@pytest.mark.parametrize(
    ("given", "repaired"),
    [
        ({"n": "3"}, {"n": 3}),
        ({"n": "3.0"}, {"n": 3}),
        ({"n": 4.0}, {"n": 4}),
        ({"n": "3.5"}, {"n": "3.5"}),
        ({"n": "three"}, {"n": "three"}),
        ({"x": "2.5"}, {"x": 2.5}),
        ({"x": "nan"}, {"x": "nan"}),
        ({"x": "NaN"}, {"x": "NaN"}),  # not a JSON number
        ({"ok": "true"}, {"ok": True}),
        ({"ok": "True"}, {"ok": True}),
        ({"ok": "yes"}, {"ok": "yes"}),
        ({"tags": '[1, "2"]'}, {"tags": [1, 2]}),
        ({"tags": [1, "2"]}, {"tags": [1, 2]}),
        ({"opts": '{"depth": "5"}'}, {"opts": {"depth": 5}}),
        ({"name": 7}, {"name": "7"}),
        ({"name": "7"}, {"name": "7"}),
        ({"either": "7"}, {"either": "7"}),  # fits the union as it is: the model's choice, kept
        ({"either": 7}, {"either": 7}),
        ({"maybe": "3"}, {"maybe": 3}),  # fits no branch of the union: repaired
        ({"maybe": None}, {"maybe": None}),
        ({"flag": "true"}, {"flag": True}),
        ({"flag": "2"}, {"flag": 2}),
        ({"nothing": "null"}, {"nothing": None}),
        ({"unknown": "1"}, {"unknown": "1"}),  # an unknown key: nothing to fit, kept
    ],
)
def test_json_values_are_kept_when_they_fit_and_repaired_when_not(
    given: dict[str, Any], repaired: dict[str, Any]
) -> None:
    assert repair_arguments(given, SCHEMA) == repaired


def test_raw_text_takes_its_best_fit_where_json_keeps_its_type() -> None:
    """The two inputs differ on unions and unknown keys only because raw text has no type."""
    union = {"type": "object", "properties": {"either": {"type": ["integer", "string"]}}}
    assert coerce_arguments({"either": "7", "extra": "[1]"}, union) == {"either": 7, "extra": [1]}
    assert repair_arguments({"either": "7", "extra": "[1]"}, union) == {"either": "7", "extra": "[1]"}
