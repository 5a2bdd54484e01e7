"""One JSON value, rewritten as it is generated into the text ``json.dumps`` writes for it.

:class:`JsonWriter` reads a JSON value piece by piece and returns, for each piece, the part of
``json.dumps(json.loads(text), ensure_ascii=False)`` that is now certain: whitespace between
tokens dropped, ``", "`` and ``": "`` between items, each string's characters re-escaped as they
arrive (an escape sequence decoded once it is whole, a surrogate pair joined), a number or literal
written as Python reads it once the character after it arrives. For a valid value without repeated
keys the pieces joined are that text, however the input was split; the text after the value is
left in :attr:`JsonWriter.rest`. The template tool-call parser
(:mod:`sparkfold.engines.template_tools`) streams a call's ``arguments`` through it, so a streamed
call joins up to the call it returned whole before it streamed.
"""

from __future__ import annotations

import json
import re

__all__ = ["JsonWriter"]

_SPACE = " \t\n\r"
_PLAIN = re.compile(r'[^"\\]+')
_ESCAPE = re.compile(r'\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})')
_LOW_SURROGATE = re.compile(r"\\u[dD][c-fC-F][0-9a-fA-F]{2}")
_ATOM = re.compile(r"[-+.0-9a-zA-Z]+")


class JsonWriter:
    """Rewrites one JSON value; ``feed`` returns the canonical text now certain."""

    def __init__(self) -> None:
        self._pending = ""  # read, not yet written: an unfinished string escape, number or literal
        self._stack: list[str] = []  # open containers, "{" or "["
        self._expect = "value"  # value | key | key_or_end | colon | next | value_or_end
        self._in_string = False
        self.done = False
        """The value is whole; what came after it is in :attr:`rest`."""
        self.failed = False
        """A character no JSON value can have there: reading stopped (the text from it is in :attr:`rest`)."""
        self.rest = ""
        self.first = ""
        """The value's first character (``{`` for an object); "" until it arrives."""

    def feed(self, text: str) -> str:
        if self.done or self.failed:
            self.rest += text
            return ""
        self._pending += text
        out: list[str] = []
        while self._pending and not (self.done or self.failed):
            if not self._step(out):
                break  # an unfinished token: wait for more text
        if self.done or self.failed:
            self.rest, self._pending = self._pending, ""
        return "".join(out)

    def flush(self) -> str:
        """The unfinished token as it was written (a cut value ends with it)."""
        pending, self._pending = self._pending, ""
        return pending if not (self.done or self.failed) else ""

    # --- internals ----------------------------------------------------------------------------

    def _take(self, size: int) -> str:
        text, self._pending = self._pending[:size], self._pending[size:]
        return text

    def _step(self, out: list[str]) -> bool:
        """Read one token from the pending text; False when it is not whole yet."""
        if self._in_string:
            return self._string(out)
        text = self._pending
        stripped = text.lstrip(_SPACE)
        if not stripped:
            self._pending = ""
            return True
        self._pending = stripped
        char = stripped[0]
        self.first = self.first or char
        expect = self._expect
        if char in "}]" and (expect in ("next", "key_or_end", "value_or_end")):
            if self._stack.pop() != {"}": "{", "]": "["}[char]:
                self.failed = True
                return True
            out.append(self._take(1))
            self._end_value()
        elif char == "," and expect == "next":
            out.append(", ")
            self._take(1)
            self._expect = "key" if self._stack[-1] == "{" else "value"
        elif char == ":" and expect == "colon":
            out.append(": ")
            self._take(1)
            self._expect = "value"
        elif char == '"' and expect in ("value", "value_or_end", "key", "key_or_end"):
            out.append(self._take(1))
            self._in_string = True
        elif char in "{[" and expect in ("value", "value_or_end"):
            out.append(self._take(1))
            self._stack.append(char)
            self._expect = "key_or_end" if char == "{" else "value_or_end"
        elif expect in ("value", "value_or_end") and _ATOM.match(stripped):
            return self._atom(out)
        else:
            self.failed = True
        return True

    def _end_value(self) -> None:
        if not self._stack:
            self.done = True
        else:
            self._expect = "next"

    def _string(self, out: list[str]) -> bool:
        text = self._pending
        plain = _PLAIN.match(text)
        if plain:
            out.append(json.dumps(plain.group(), ensure_ascii=False)[1:-1])
            self._take(plain.end())
        elif text[0] == '"':
            out.append(self._take(1))
            self._in_string = False
            if self._expect in ("key", "key_or_end"):
                self._expect = "colon"
            else:
                self._end_value()
        else:  # a backslash
            escape = _ESCAPE.match(text)
            if escape is None:
                if len(text) < 6 and re.fullmatch(r"\\(u[0-9a-fA-F]{0,3})?", text):
                    return False
                self.failed = True
                return True
            end = escape.end()
            if 0xD800 <= _code(escape.group()) < 0xDC00:  # a high surrogate: joined with a low one
                after = text[end : end + 6]
                if len(after) < 6 and re.fullmatch(r"(\\(u([dD]([c-fC-F][0-9a-fA-F]{0,1})?)?)?)?", after):
                    return False
                if _LOW_SURROGATE.fullmatch(after):
                    end += 6
            decoded = json.loads(f'"{self._take(end)}"')
            out.append(json.dumps(decoded, ensure_ascii=False)[1:-1])
        return True

    def _atom(self, out: list[str]) -> bool:
        found = _ATOM.match(self._pending)
        assert found is not None
        if found.end() == len(self._pending):
            return False  # the number or literal may go on
        try:
            value = json.loads(found.group())
        except ValueError:
            self.failed = True
            return True
        out.append(json.dumps(value))
        self._take(found.end())
        self._end_value()
        return True


def _code(escape: str) -> int:
    return int(escape[2:], 16) if escape.startswith("\\u") else 0
