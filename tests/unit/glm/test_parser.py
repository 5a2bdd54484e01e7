"""The GLM output parser: reasoning split, tool calls, stop tokens, and split invariance."""

from __future__ import annotations

import itertools
import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sparkfold.glm.parser import (
    GlmParser,
    ParsedMessage,
    ParsedToolCall,
    ToolCallPiece,
    parse_output,
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "hourly": {"type": "boolean"},
                    "filters": {"type": "object"},
                    "tags": {"type": "array"},
                    "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
                },
            },
        },
    },
    {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}},
]


def ids() -> Any:
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def parse(text: str, **kwargs: Any) -> ParsedMessage:
    return parse_output(text, TOOLS, id_factory=ids(), **kwargs)


def joined(pieces: list[ToolCallPiece]) -> list[ParsedToolCall]:
    """The calls that streamed ``pieces`` add up to (the first piece of each names it)."""
    calls: dict[int, ParsedToolCall] = {}
    for piece in pieces:
        if piece.name is not None:
            assert piece.index not in calls and piece.id is not None
            calls[piece.index] = ParsedToolCall(piece.index, piece.id, piece.name, piece.arguments)
        else:
            before = calls[piece.index]
            calls[piece.index] = replace(before, arguments=before.arguments + piece.arguments)
    return [calls[i] for i in sorted(calls)]


def streamed(
    pieces: list[str], *, truncated: bool = False, thinking: bool = True, **options: Any
) -> ParsedMessage:
    parser = GlmParser(TOOLS, thinking=thinking, id_factory=ids(), **options)
    reasoning, content, calls = "", "", []
    for piece in pieces:
        delta = parser.feed(piece)
        reasoning += delta.reasoning
        content += delta.content
        calls += delta.tool_calls
    delta = parser.finish(truncated=truncated)
    reasoning += delta.reasoning
    content += delta.content
    calls += delta.tool_calls
    assert joined(calls) == parser.tool_calls
    return ParsedMessage(reasoning, content, parser.tool_calls, parser.finish_reason)


def args(message: ParsedMessage, index: int = 0) -> dict[str, Any]:
    return dict(json.loads(message.tool_calls[index].arguments))


def call(name: str, **values: str) -> str:
    body = "".join(f"<arg_key>{k}</arg_key><arg_value>{v}</arg_value>" for k, v in values.items())
    return f"<tool_call>{name}{body}</tool_call>"


def test_reasoning_and_content_are_split() -> None:
    message = parse("\nLet me think.\n</think>\n\nThe answer is 4.\n<|user|>ignored")
    assert (message.reasoning, message.content, message.finish_reason) == (
        "Let me think.",
        "The answer is 4.",
        "stop",
    )


def test_thinking_off_is_all_content() -> None:
    assert parse("plain answer", thinking=False).content == "plain answer"
    assert parse("<think>oops</think>answer", thinking=False).reasoning == "oops"


def test_tool_calls_are_typed_by_the_schema() -> None:
    text = (
        "need weather</think>Checking."
        + call(
            "get_weather",
            city="Paris",
            days="3",
            hourly="true",
            filters='{"a": [1, {"b": null}]}',
            tags='["x"]',
            limit="null",
            extra="5",
        )
        + call("now")
        + "<|observation|>"
    )
    message = parse(text)
    assert message.finish_reason == "tool_calls"
    assert message.content == "Checking."
    assert args(message) == {
        "city": "Paris",
        "days": 3,
        "hourly": True,
        "filters": {"a": [1, {"b": None}]},
        "tags": ["x"],
        "limit": None,
        "extra": 5,
    }
    assert [c.name for c in message.tool_calls] == ["get_weather", "now"]
    assert args(message, 1) == {}
    assert [c.index for c in message.tool_calls] == [0, 1]


def test_string_values_stay_raw() -> None:
    message = parse("</think>" + call("get_weather", city="  42 \n", days="3"))
    assert args(message) == {"city": "  42 \n", "days": 3}


def test_unicode_and_nested_arguments() -> None:
    message = parse(
        "</think>" + call("get_weather", city="Zürich 東京 🌧", filters='{"深": {"ñ": ["é", 1.5]}}')
    )
    assert args(message) == {"city": "Zürich 東京 🌧", "filters": {"深": {"ñ": ["é", 1.5]}}}


def test_call_inside_the_think_block_is_a_call() -> None:
    message = parse("I will call it" + call("get_weather", city="Oslo") + "</think><|observation|>")
    assert message.reasoning == "I will call it"
    assert message.content == ""
    assert args(message) == {"city": "Oslo"}


def test_a_truncated_call_ends_where_it_was_cut() -> None:
    message = parse(
        "</think>Wait." + "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Par", truncated=True
    )
    assert message.content == "Wait." and message.finish_reason == "length"
    assert [(c.name, c.arguments) for c in message.tool_calls] == [("get_weather", '{"city": "Par')]


@pytest.mark.parametrize(
    ("text", "arguments"),
    [
        (
            "get_weather<arg_key>days</arg_key><arg_value>1",
            '{"days": '[:0],
        ),  # a typed value waits for its end
        ("get_weather<arg_key>city</arg_key><arg_value>Oslo</arg_value><arg_key>da", '{"city": "Oslo"'),
        ("get_weather", ""),
        ('get_weather>{"city": "Os', '{"city": "Os'),
    ],
)
def test_a_truncated_call_keeps_what_was_generated(text: str, arguments: str) -> None:
    message = parse("</think><tool_call>" + text, truncated=True)
    assert [(c.name, c.arguments) for c in message.tool_calls] == [("get_weather", arguments)]


def test_a_call_cut_before_its_name_is_known_is_not_a_call() -> None:
    assert parse("</think><tool_call>get_wea", truncated=True).tool_calls == []


def test_call_ended_by_a_stop_token_without_close_is_complete() -> None:
    message = parse(
        "</think><tool_call>get_weather<arg_key>city</arg_key><arg_value>Rome</arg_value><|observation|>"
    )
    assert args(message) == {"city": "Rome"}


@pytest.mark.parametrize(
    "body",
    [
        "get_weather<arg_key>city</arg_key>Lima</arg_value>",  # missing <arg_value>
        "get_weather<arg_key>x</arg_key><arg_value>1</arg_value>city</arg_key><arg_value>Lima</arg_value>",
        "get_weather<arg_key>city</arg_key></arg_key><arg_value>Lima</arg_value></arg_value>",
        'get_weather>{"city": "Lima"}',  # JSON form
        'Weather/get_weather>{"city": "Lima"}',  # display name
    ],
)
def test_malformed_calls_are_repaired(body: str) -> None:
    """Missing <arg_value>, missing <arg_key>, doubled closers, the JSON form, a display name."""
    if body.startswith("get_weather city"):
        body = (
            "get_weather<arg_key>x</arg_key><arg_value>1</arg_value>city</arg_key><arg_value>Lima</arg_value>"
        )
    message = parse(f"</think><tool_call>{body}</tool_call>")
    assert message.tool_calls[0].name == "get_weather"
    assert args(message)["city"] == "Lima"


@pytest.mark.parametrize(
    "body", ["delete_everything<arg_key>x</arg_key><arg_value>1</arg_value>", "", "get_weather>{not json"]
)
def test_unoffered_or_unreadable_calls_are_not_returned(body: str) -> None:
    parser = GlmParser(TOOLS)
    parser.feed(f"</think>ok<tool_call>{body}</tool_call>")
    parser.finish()
    assert parser.tool_calls == [] and parser.rejected == [body]
    assert parser.message().content == "ok" and parser.finish_reason == "stop"


def test_no_tools_offered_means_no_calls() -> None:
    message = parse_output("</think>" + call("get_weather", city="x"), None)
    assert message.tool_calls == []


@pytest.mark.parametrize("stop", ["<|observation|>", "<|user|>", "<|assistant|>", "<|endoftext|>"])
def test_stop_tokens_end_the_reply_and_never_leak(stop: str) -> None:
    message = streamed(["r</think>answer", stop[:3], stop[3:], " more <|user|> text"])
    assert message.content == "answer"
    assert stop not in message.reasoning + message.content


@pytest.mark.parametrize("token", ["<|end_of_transcription|>", "[gMASK]", "<|begin_of_box|>", "<|image|>"])
def test_other_control_tokens_are_skipped_from_the_text(token: str) -> None:
    message = streamed(["why", token[:4], token[4:] + "</think>an", token, "swer"])
    assert (message.reasoning, message.content) == ("why", "answer")


def test_a_call_streams_as_it_is_generated() -> None:
    """The name at the first argument tag, a string value piece by piece, a typed value whole."""
    parser = GlmParser(TOOLS, id_factory=ids())
    parser.feed("</think>")
    steps = [
        "<tool_call>get_weather",
        "<arg_key>city</arg_key>",
        "<arg_value>Sa",
        'o "P',
        'aulo"\n</arg',
        "_value>",
    ]
    steps += ["<arg_key>days</arg_key><arg_value>1", "2</arg_value>", "</tool_call>"]
    wire = [
        [c.model_dump(exclude_none=True) for c in parser.feed(p).to_delta().tool_calls or []] for p in steps
    ]
    first = {
        "index": 0,
        "id": "call_0",
        "type": "function",
        "function": {"name": "get_weather", "arguments": ""},
    }
    assert wire[:2] == [[], [first]]
    pieces = [p["function"]["arguments"] for step in wire[2:] for p in step]
    assert pieces == ['{"city": "Sa', 'o \\"P', 'aulo\\"\\n', '"', ', "days": 12', "}"]
    assert json.loads("".join(pieces)) == {"city": 'Sao "Paulo"\n', "days": 12}
    assert parser.feed("<|observation|>").empty and parser.finished


def test_text_that_says_nothing_yet_is_an_empty_delta() -> None:
    parser = GlmParser(TOOLS)
    assert parser.feed("</think>").empty and parser.feed("<tool_call>get_wea").empty


def test_an_identical_call_is_dropped_and_ends_the_reply() -> None:
    same = call("get_weather", city="Oslo")
    other = call("get_weather", city="Osaka")
    message = streamed(["</think>", same, other, same, call("now")], truncated=False)
    assert [json.loads(c.arguments)["city"] for c in message.tool_calls] == ["Oslo", "Osaka"]
    assert message.finish_reason == "tool_calls"


def test_a_repeat_is_held_until_it_differs() -> None:
    parser = GlmParser(TOOLS, id_factory=ids())
    parser.feed("</think>" + call("get_weather", city="Oslo"))
    assert parser.feed("<tool_call>get_weather<arg_key>city</arg_key><arg_value>Os").empty
    (piece,) = parser.feed("a").tool_calls
    assert (piece.name, piece.arguments) == ("get_weather", '{"city": "Osa')


def test_max_calls_ends_the_reply() -> None:
    calls = [call("get_weather", city=c) for c in ("A", "B", "C")]
    message = streamed(["</think>", *calls], max_calls=2)
    assert len(message.tool_calls) == 2


def test_partial_tags_are_held_not_leaked() -> None:
    parser = GlmParser(TOOLS)
    first = parser.feed("thinking</thi")
    assert first.reasoning == "thinking"
    assert parser.feed("nk>a <|us").content == "a"
    assert parser.feed("e").empty
    assert parser.feed("d").content == " <|used"


# --- split invariance ------------------------------------------------------------------------

SEGMENTS = st.sampled_from(
    [
        "plain ",
        "ü東🌧",
        "a < b > c",
        "\n",
        "  ",
        "</think>",
        "<think>",
        "<|observation|>",
        "<|user|>",
        "<|assistant|>",
        "<tool_call>",
        "</tool_call>",
        "get_weather",
        "now",
        "unknown_tool",
        "<arg_key>",
        "</arg_key>",
        "<arg_value>",
        "</arg_value>",
        "city",
        "days",
        "12",
        '{"k": [1, "é"]}',
        "</arg_value>",
        'get_weather>{"city": "Oslo"}',
        "<",
        "</",
        "<|",
        "tool",
    ]
)
SCRIPTS = st.lists(SEGMENTS, max_size=24).map("".join)


def _same(a: ParsedMessage, b: ParsedMessage) -> None:
    assert (a.reasoning, a.content, a.finish_reason) == (b.reasoning, b.content, b.finish_reason)
    assert [(c.name, c.arguments) for c in a.tool_calls] == [(c.name, c.arguments) for c in b.tool_calls]


@settings(max_examples=150, deadline=None)
@given(text=SCRIPTS, truncated=st.booleans(), thinking=st.booleans())
def test_split_at_every_position_gives_the_same_result(text: str, truncated: bool, thinking: bool) -> None:
    whole = streamed([text], truncated=truncated, thinking=thinking)
    for cut in range(len(text) + 1):
        _same(streamed([text[:cut], text[cut:]], truncated=truncated, thinking=thinking), whole)
    _same(streamed(list(text), truncated=truncated, thinking=thinking), whole)


@settings(max_examples=100, deadline=None)
@given(text=SCRIPTS, cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=6))
def test_any_chunking_gives_the_same_result(text: str, cuts: list[int]) -> None:
    points = sorted({min(c, len(text)) for c in cuts})
    pieces = [text[a:b] for a, b in itertools.pairwise([0, *points, len(text)])]
    _same(streamed(pieces), streamed([text]))


@settings(max_examples=100, deadline=None)
@given(text=SCRIPTS)
def test_control_tokens_never_reach_the_text(text: str) -> None:
    message = streamed([text])
    tags = (
        "<|observation|>",
        "<|user|>",
        "<|assistant|>",
        "<tool_call>",
        "</tool_call>",
        "</think>",
        "<arg_key>",
    )
    for tag in (*tags, "</arg_key>", "<arg_value>", "</arg_value>"):
        assert tag not in message.reasoning + message.content
