"""The demo model's ``<tool_call>`` JSON parser: calls stream as they are written, joined up they
are the calls the whole reply gives, and a reply's calls are bounded as GLM's are."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import pytest

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
    """The calls, their pieces joined (the first piece of each names it)."""
    calls: dict[int, list[str]] = {}
    for piece in (c for d in deltas for c in d.tool_calls or []):
        assert piece.function is not None
        if piece.index not in calls:
            assert piece.id and piece.function.get("name"), "a call's first piece names it"
            calls[piece.index] = [str(piece.function["name"]), ""]
        else:
            assert piece.id is None and "name" not in piece.function
        calls[piece.index][1] += str(piece.function["arguments"])
    return [(name, arguments) for name, arguments in calls.values()]


def reply_of(pieces: Iterable[str], finish: str = "stop") -> tuple[str, list[tuple[str, str]], bool]:
    """Content, calls and ``ended`` of a reply fed in ``pieces``."""
    parser = ToolCallParser(TOOLS, max_calls=3)
    deltas = [d for piece in pieces for d in parser.feed(piece)] + parser.finish(finish)
    return "".join(d.content or "" for d in deltas), calls_of(deltas), parser.ended


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


BODY = (
    '{"sides":6 , "label" : "caf\\u00e9\\n\\/x \\ud83d\\ude00",'
    ' "faces": [1.50, -0, 1e16, true, null, {}], "extra": {"a": []}}'
)


def tagged(*bodies: str) -> str:
    return "".join(f"<tool_call>{body}</tool_call>" for body in bodies)


REPLIES = {
    "text and a call": "Let me roll. " + call("roll", sides=6) + " Done.",
    "odd whitespace and escapes": f'<tool_call>\n  {{ "name" : "roll",\n"arguments":{BODY} }}\n</tool_call>',
    "parameters, other keys, no arguments": tagged(
        '{"name": "roll", "id": {"x": [1]}, "parameters": {"n": 1}}', '{"name": "get_time"}'
    ),
    "arguments as a string, or not an object": tagged(
        '{"name": "roll", "arguments": "{\\"n\\": 2}"}', '{"name": "get_time", "arguments": null}'
    ),
    "arguments before the name": '<tool_call>{"arguments": {"n": 3}, "name": "roll"}</tool_call>',
    "a tool not offered, and broken calls": call("launch", target="moon")
    + "<tool_call>{'name': 'roll'}</tool_call>"
    + '<tool_call>{"name": "rol</tool_call>',
    "a repeat ends the reply": call("roll", sides=6) + call("roll", sides=6) + "after",
    "a held call that differs goes out": call("roll", sides=6)
    + call("roll", sides=60)
    + call("roll", sides=6),
    "the cap": call("roll", sides=1) + call("roll", sides=2) + call("roll", sides=3) + call("roll", sides=4),
    "a call the reply ends": 'x <tool_call>{"name": "roll", "arguments": {"n": [1, 2]}}',
}


@pytest.mark.parametrize("finish", ["stop", "length"])
@pytest.mark.parametrize("text", REPLIES.values(), ids=REPLIES.keys())
def test_the_reply_is_the_same_however_it_is_split(text: str, finish: str) -> None:
    whole = reply_of([text], finish)
    assert reply_of(text, finish) == whole  # one character at a time, as tokens may come
    for at in range(1, len(text)):
        assert reply_of([text[:at], text[at:]], finish) == whole, at
    for end in range(0, len(text), 7):  # cut by max_tokens anywhere: the same, split or not
        assert reply_of(text[:end], "length") == reply_of([text[:end]], "length"), end


def test_a_whole_call_is_the_call_as_json_reads_it() -> None:
    """Joined up, a streamed call is what it was before calls streamed: ``json.loads`` of the
    body, its arguments written back by ``json.dumps``, or text when it is not an offered call."""
    content, calls, ended = reply_of(REPLIES["odd whitespace and escapes"])
    assert (content, calls, ended) == (
        "",
        [("roll", json.dumps(json.loads(BODY), ensure_ascii=False))],
        False,
    )
    assert reply_of(REPLIES["parameters, other keys, no arguments"])[1] == [
        ("roll", '{"n": 1}'),
        ("get_time", "{}"),
    ]
    assert reply_of(REPLIES["arguments as a string, or not an object"])[1] == [
        ("roll", '{"n": 2}'),
        ("get_time", "null"),
    ]
    assert reply_of(REPLIES["arguments before the name"])[1] == [("roll", '{"n": 3}')]
    broken = REPLIES["a tool not offered, and broken calls"]
    assert reply_of(broken) == (broken, [], False)
    assert reply_of(REPLIES["a repeat ends the reply"]) == ("", [("roll", '{"sides": 6}')], True)
    assert reply_of(REPLIES["a held call that differs goes out"])[1:] == (
        [("roll", '{"sides": 6}'), ("roll", '{"sides": 60}')],
        True,
    )
    assert len(reply_of(REPLIES["the cap"])[1]) == 3
    assert reply_of(REPLIES["a call the reply ends"])[:2] == ("x ", [("roll", '{"n": [1, 2]}')])


def stream(text: str) -> list[tuple[int, list[Delta]]]:
    """What each character of ``text`` gives, fed one at a time (with its position)."""
    parser = ToolCallParser(TOOLS)
    return [(at, parser.feed(char)) for at, char in enumerate(text)]


def test_a_call_is_named_when_its_name_is_written_and_its_arguments_stream() -> None:
    text = call("roll", sides=6, label="a long label, written one token at a time")
    fed = [(at, d) for at, deltas in stream(text) for d in deltas]
    first_at, first = fed[0]
    assert first.tool_calls and first.tool_calls[0].function == {"name": "roll", "arguments": ""}
    assert text[: first_at + 1].endswith('"name": "roll"')  # announced as the name string closes
    pieces = [d for _, d in fed[1:]]
    assert len(pieces) > len("a long label, written one token at a time")
    assert fed[-1][0] < text.index("</tool_call>")  # every piece before the closing tag
    assert calls_of([first, *pieces]) == [
        ("roll", json.dumps({"sides": 6, "label": "a long label, written one token at a time"}))
    ]


def test_a_call_that_repeats_an_earlier_one_is_held_until_it_differs() -> None:
    first = call("roll", sides=6)
    again = call("roll", sides=65)
    fed = stream(first + again)
    held = [at for at, deltas in fed if deltas and at >= len(first)]
    assert held and held[0] == len(first) + again.index("65}") + 2  # 65 is whole at "}": now it differs
    assert calls_of([d for _, deltas in fed for d in deltas]) == [
        ("roll", '{"sides": 6}'),
        ("roll", '{"sides": 65}'),
    ]


def test_a_shape_that_does_not_stream_arrives_whole_at_its_end() -> None:
    text = REPLIES["arguments before the name"]
    fed = [(at, deltas) for at, deltas in stream(text) if deltas]
    assert [at for at, _ in fed] == [len(text) - 1]  # at </tool_call>'s last character


def test_a_call_cut_by_max_tokens_streamed_as_far_as_it_was_written() -> None:
    text = call("roll", label="The quick brown fox jumps")
    cut = text[: text.index("fox") + 3]
    parser = ToolCallParser(TOOLS)
    streamed = [d for char in cut for d in parser.feed(char)]
    assert calls_of(streamed) == [("roll", '{"label": "The quick brown fox')]
    assert calls_of(streamed + parser.finish("length")) == [("roll", '{"label": "The quick brown fox')]
    before_name = call("roll")[: call("roll").index("rol") + 3]
    assert reply_of([before_name], "length") == ("", [], False)  # today's rule: no name, no call
