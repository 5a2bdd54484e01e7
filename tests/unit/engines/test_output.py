from __future__ import annotations

from sparkfold.engines.output import PlainParser, TextStream


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
