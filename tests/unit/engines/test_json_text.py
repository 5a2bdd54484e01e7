"""A JSON value rewritten as it arrives: joined, the pieces are ``json.dumps(json.loads(text))``."""

from __future__ import annotations

import json

import pytest

from sparkfold.engines.json_text import JsonWriter

VALUES = [
    '{"a":1.50,"b":"\\u00e9\\/x\\n\\t","c":[1, 2 ,{}],"d":null, "e": true, "f": -0, "g": 1e16}',
    '{ "emoji": "\\ud83d\\ude00", "lone": "\\ud83d x", "top": "\\udbff\\udfff", "k\\"ey": "a\\\\b" }',
    '[ [] , {} , "</tool_call>" , NaN, -Infinity, 12345678901234567890 ]',
    '"a string\\u0041"',
]


def written(pieces: list[str]) -> tuple[str, JsonWriter]:
    writer = JsonWriter()
    return "".join(writer.feed(piece) for piece in pieces), writer


@pytest.mark.parametrize("text", VALUES)
def test_the_pieces_join_up_to_json_dumps_however_the_text_is_split(text: str) -> None:
    want = json.dumps(json.loads(text), ensure_ascii=False)
    for pieces in (
        [text + " }"],
        [*text, " ", "}"],
        *([text[:at], text[at:] + "}"] for at in range(len(text))),
    ):
        out, writer = written(pieces)
        assert (out, writer.done, writer.rest.strip()) == (want, True, "}")
        assert writer.first == text.strip()[0]


def test_text_that_is_no_json_value_stops_the_reading() -> None:
    for bad, read in [('{"a" 1}', '{"a"'), ("[1,]", "[1, "), ('{"a": "\\x"}', '{"a": "'), ("{'a': 1}", "{")]:
        out, writer = written([bad])
        assert (out, writer.failed, writer.done) == (read, True, False), bad


def test_an_unfinished_value_ends_as_it_was_written() -> None:
    writer = JsonWriter()
    assert writer.feed('{"n": [12, 3') == '{"n": [12, '
    assert writer.flush() == "3" and not writer.done
