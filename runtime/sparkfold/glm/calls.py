"""One GLM tool call, turned into OpenAI ``tool_calls`` pieces as it is generated.

GLM writes ``NAME<arg_key>K</arg_key><arg_value>V</arg_value>…`` between ``<tool_call>`` and
``</tool_call>`` (reference ``glm.md`` 7); :class:`CallWriter` reads that body piece by piece and
writes the call's JSON arguments as soon as they are certain:

* The call is announced (index, id, name) at its first argument tag, once the name is known to
  be offered; a name that was not offered makes the call rejected (never a piece).
* A value whose property is a plain string (``coerce_value`` keeps any text as it is: no
  ``enum``, no length bounds) streams as it is generated, JSON-escaped piece by piece; any other
  value is typed by the schema when it closes and written whole.
* Repairs, the same whether the call arrives in one piece or many: a value without
  ``<arg_value>`` before it is committed at ``</arg_value>``; a value left open is closed by the
  next ``<arg_key>`` or the end of the call; a doubled ``<arg_value>`` inside a streamed value is
  dropped; a key without a value is dropped. The JSON form ``NAME>{…}`` and a call without
  arguments are read when the call ends.
* A call that repeats an earlier call of the reply so far is held back (its pieces go out as soon
  as it differs); one that turns out identical is dropped and :attr:`CallWriter.repeated` says so.

Nothing here looks at tokens: the text may be split anywhere, and the pieces put together are the
same.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sparkfold.glm.arguments import coerce_value, streams_raw
from sparkfold.glm.tokens import partial_tag
from sparkfold.protocol import ToolCallDelta

__all__ = ["ARG_TAGS", "CallGate", "CallWriter", "ParsedToolCall", "ToolCallPiece"]

ARG_TAGS = ("<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")
_ARG_TAG = re.compile("(" + "|".join(map(re.escape, ARG_TAGS)) + ")")


@dataclass(frozen=True)
class ParsedToolCall:
    """A whole call (cut short when the reply was)."""

    index: int
    id: str
    name: str
    arguments: str  # JSON text (a prefix of it, for a cut call)

    def wire(self) -> dict[str, Any]:
        """The OpenAI ``tool_calls`` entry."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True)
class ToolCallPiece:
    """One streamed piece of a call: the first carries ``id`` and ``name``, each a piece of ``arguments``."""

    index: int
    arguments: str
    id: str | None = None
    name: str | None = None

    def delta(self) -> ToolCallDelta:
        """The wire piece: the first carries the call's id, type and name (OpenAI's shape)."""
        if self.name is None:
            return ToolCallDelta(index=self.index, function={"arguments": self.arguments})
        return ToolCallDelta(
            index=self.index,
            id=self.id,
            type="function",
            function={"name": self.name, "arguments": self.arguments},
        )


class CallGate:
    """When the pieces of call ``index`` may go out, for any call form (GLM's tags, the template
    models' JSON): the first, once the call is named, announces it; a call that so far repeats an
    ``earlier`` call of the reply (same name, its arguments a prefix of that call's) is held until
    it differs, so one that ends identical was never sent and can be dropped."""

    def __init__(self, index: int, earlier: Sequence[ParsedToolCall]) -> None:
        self.index = index
        self._earlier = earlier
        self._sent = -1  # characters of the arguments sent; -1: not announced yet

    def release(self, call_id: str, name: str, arguments: str, *, force: bool = False) -> list[ToolCallPiece]:
        """The pieces of ``arguments`` (the call's JSON text so far) not sent yet; ``force``: the
        call ended and is no repeat, so a held call goes out."""
        if self._sent < 0:
            if not force and any(c.name == name and c.arguments.startswith(arguments) for c in self._earlier):
                return []  # so far a repeat of an earlier call: held
            self._sent = len(arguments)
            return [ToolCallPiece(self.index, arguments, id=call_id, name=name)]
        piece, self._sent = arguments[self._sent :], len(arguments)
        return [ToolCallPiece(self.index, piece)] if piece else []

    def repeats(self, name: str, arguments: str) -> bool:
        """Whether the call, ended as ``arguments``, is an earlier call again (nothing of it was sent)."""
        return self._sent < 0 and any(c.name == name and c.arguments == arguments for c in self._earlier)


def _text(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


class CallWriter:
    """The call opened at ``index``; ``resolve`` maps a written name to an offered one (or None)."""

    def __init__(
        self,
        index: int,
        *,
        schemas: Mapping[str, Any],
        resolve: Callable[[str], str | None],
        new_id: Callable[[], str],
        earlier: Sequence[ParsedToolCall],
    ) -> None:
        self.index = index
        self._schemas, self._resolve, self._new_id = schemas, resolve, new_id
        self._gate = CallGate(index, earlier)
        self.body = ""
        """Everything fed so far (the raw call, for the log when it is rejected)."""
        self._read = 0  # body[:_read] is processed
        self.name: str | None = None
        self.rejected = False
        self.repeated = False
        self._id = ""
        self._arguments = ""  # JSON text written so far
        self._keys = 0
        self._key: str | None = None
        self._buffer = ""
        self._open = False  # inside <arg_value> for self._key
        self._streaming = False  # its string is being written

    # --- public -------------------------------------------------------------------------------

    def feed(self, text: str) -> list[ToolCallPiece]:
        self.body += text
        self._advance(final=False)
        return self._release()

    def close(self, *, cut: bool = False) -> tuple[ParsedToolCall | None, list[ToolCallPiece]]:
        """The call ended (``cut``: by the token budget). The whole call (None if there is none:
        rejected, repeated, or cut before its name) and its last pieces."""
        if self.name is None and not self.rejected:
            self._read_whole(cut)
        elif not self.rejected and not cut:
            self._advance(final=True)
            self._close_value()
            self._write("}" if self._keys else "{}")
        if self.rejected or self.name is None:
            return None, []
        if not cut and self._gate.repeats(self.name, self._arguments):
            self.repeated = True
            return None, []
        pieces = self._release(force=True)
        return ParsedToolCall(self.index, self._id, self.name, self._arguments), pieces

    # --- internals ----------------------------------------------------------------------------

    def _release(self, force: bool = False) -> list[ToolCallPiece]:
        if self.name is None or self.rejected:
            return []
        return self._gate.release(self._id, self.name, self._arguments, force=force)

    def _announce(self, raw_name: str) -> None:
        name = self._resolve(raw_name)
        if name is None:
            self.rejected = True
        else:
            self.name, self._id = name, self._new_id()

    def _read_whole(self, cut: bool) -> None:
        """A call with no argument tag: ``NAME``, or the JSON form ``NAME>{…}``."""
        head, brace, rest = self.body.partition("{")
        self._announce(head)
        if self.name is None:
            return
        if cut:
            self._arguments = brace + rest
            return
        try:
            value = json.loads(brace + rest) if brace else {}
        except json.JSONDecodeError:
            value = None
        if isinstance(value, dict):
            self._arguments = _text(value)
        else:
            self.name, self.rejected = None, True

    def _advance(self, *, final: bool) -> None:
        if self.rejected:
            return
        text = self.body[self._read :]
        if self.name is None:
            found = _ARG_TAG.search(text)
            if found is None:
                return  # the name is still being written, or the call has no argument tag
            self._announce(text[: found.start()])
            self._read += found.start()
            if self.rejected:
                return
            text = text[found.start() :]
        end = len(text) if final else len(text) - partial_tag(text, ARG_TAGS)
        for part in _ARG_TAG.split(text[:end]):
            if part in ARG_TAGS:
                self._tag(part)
            elif part:
                self._piece(part)
        self._read += end

    def _property(self, key: str) -> Any:
        properties = (self._schemas.get(self.name or "") or {}).get("properties")
        return properties.get(key) if isinstance(properties, Mapping) else None

    def _write(self, text: str) -> None:
        self._arguments += text

    def _start(self, key: str) -> None:
        self._write(("{" if not self._keys else ", ") + _text(key) + ": ")
        self._keys += 1

    def _piece(self, text: str) -> None:
        key = self._key
        if self._open and key is not None and streams_raw(self._property(key)):
            if not self._streaming:
                self._start(key)
                self._write('"')
                self._streaming = True
            self._write(_text(text)[1:-1])
        else:
            self._buffer += text

    def _commit(self) -> None:
        """The held value of the current key, typed by its schema."""
        if self._key is not None:
            self._start(self._key)
            self._write(_text(coerce_value(self._buffer, self._property(self._key))))
        self._key, self._buffer, self._open = None, "", False

    def _close_value(self) -> None:
        if self._streaming:
            self._write('"')
            self._key, self._buffer, self._open, self._streaming = None, "", False, False
        elif self._open:
            self._commit()

    def _tag(self, tag: str) -> None:
        if tag == "</arg_value>":
            if self._streaming:
                self._close_value()
            else:
                self._commit()  # a value without its opener is still a value
        elif tag == "<arg_value>":
            if self._streaming:
                return  # doubled opener inside a value
            self._buffer = ""
            self._open = self._key is not None
        elif tag == "<arg_key>":
            self._close_value()
            self._buffer = ""
        elif self._streaming:  # </arg_key> inside a value: it ends there
            self._close_value()
        else:  # </arg_key>
            if self._buffer.strip():
                self._key = self._buffer.strip()
            self._buffer, self._open = "", False
