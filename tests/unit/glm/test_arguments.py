"""Tool-call argument values typed by the offered schema."""

from __future__ import annotations

from typing import Any

import pytest

from sparkfold.glm.arguments import coerce_arguments, coerce_value


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
