from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

from sparkfold.engines.output import PlainParser, TextStream, plain_parser
from sparkfold.protocol import ChatCompletionRequest


def _decode(ids: list[int]) -> str:
    return bytes(ids).decode(errors="replace")


def _run(text: bytes, stop: list[str]) -> tuple[str, bool]:
    stream = TextStream(_decode, stop)
    out = []
    for byte in text:
        out.append(stream.push(byte))
        if stream.stopped:
            break
    out.append(stream.flush())
    return "".join(out), stream.stopped


def test_plain_text_passes_through() -> None:
    assert _run(b"hello world", []) == ("hello world", False)


def test_stop_string_cuts_the_reply_before_it() -> None:
    assert _run(b"one, two. three", [". "]) == ("one, two", True)


def test_text_that_only_starts_like_a_stop_string_is_released_at_the_end() -> None:
    assert _run(b"abc END", ["ENDING"]) == ("abc END", False)


def test_multibyte_characters_are_never_split() -> None:
    stream = TextStream(_decode)
    pieces = [stream.push(b) for b in "é€".encode()]
    assert "\ufffd" not in "".join(pieces)
    assert "".join(pieces) + stream.flush() == "é€"


def test_plain_parser_calls_everything_content() -> None:
    parser = PlainParser()
    assert [d.content for d in parser.feed("hi")] == ["hi"]
    assert parser.feed("") == [] and parser.finish() == [] and not parser.tool_calls_made


def test_a_real_tokenizer_round_trips_through_the_window() -> None:

    vocab = {"[UNK]": 0, "Ġhello": 1, "Ġworld": 2, "hello": 3, "!": 4, "Ġ": 5}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    ids = [3, 2, 1, 4, 2]
    stream = TextStream(lambda part: tokenizer.decode(list(part)))
    text = "".join(stream.push(i) for i in ids) + stream.flush()
    assert text == tokenizer.decode(ids) == "hello world hello! world"


WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


@pytest.mark.parametrize(
    ("written", "call"),
    [
        ('{"name": "get_weather", "arguments": {"city": "Pa', ("get_weather", '{"city": "Pa')),
        ('{"name": "get_weather", "argu', ("get_weather", "")),
        ('{"name": "get_wea', None),  # its name is not whole: not a call
        ('{"name": "rm_rf", "arguments": {', None),  # not offered
    ],
)
def test_a_template_call_cut_by_max_tokens_comes_back_as_far_as_it_went(
    written: str, call: tuple[str, str] | None
) -> None:
    request = ChatCompletionRequest.model_validate(
        {"messages": [{"role": "user", "content": "x"}], "tools": [WEATHER]}
    )
    parser = plain_parser(request)
    deltas = parser.feed("ok <tool_call>\n" + written) + parser.finish("length")  # streamed up to the cut
    assert [d.content for d in deltas if d.content] == ["ok "]
    pieces = [c.function or {} for d in deltas for c in d.tool_calls or []]
    joined = [(pieces[0]["name"], "".join(p["arguments"] for p in pieces))] if pieces else []
    assert joined == ([] if call is None else [call])
