"""Tool calls for models served through their own chat template (the demo model, SmolLM2).

The form is the one Hermes- and Qwen-style templates teach, and xgrammar's ``qwen_3`` structural
tag forces::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

:func:`template_messages` writes a conversation for a template: text parts joined into one
string (templates concatenate ``content`` as a string), and, when the template does not render
``tools`` itself (:func:`renders_tools`), the offered tools as a system message in that form,
earlier calls as that text and tool results as ``<tool_response>`` user turns.
:class:`ToolCallParser` reads the reply (the engine's ``OutputParser`` seam): text outside a call
is content; a call streams as it is generated, as GLM's do (:mod:`sparkfold.glm.calls`): announced
(index, id, name) as soon as ``{"name": "<an offered tool>"`` is written, then its ``arguments``
JSON piece by piece, rewritten into the text ``json.dumps`` gives
(:class:`~sparkfold.engines.json_text.JsonWriter`), so the pieces join up to the call a whole
reply gives. A body of another shape (``arguments`` before ``name``) is read whole at its end; a
name not offered, or a body that is not a call, stays content. Once announced a call stays one:
text after its object is dropped, a body ended early gives its arguments as far as written. A call
cut by ``max_tokens`` comes back as far as it was written once its offered name is complete, never
dropped. It is written here because no maintained library parses this form incrementally without
bringing a serving stack with it.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic_core import from_json

from sparkfold.engines.json_text import JsonWriter
from sparkfold.glm.calls import CallGate, ParsedToolCall, ToolCallPiece
from sparkfold.glm.errors import RenderError
from sparkfold.glm.messages import TEXT_PART_TYPES
from sparkfold.glm.tokens import partial_tag
from sparkfold.protocol import Delta

__all__ = ["CALL_END", "CALL_START", "ToolCallParser", "renders_tools", "template_messages"]

CALL_START = "<tool_call>"
CALL_END = "</tool_call>"
_ARGUMENTS_KEY = re.compile(r'"(?:arguments|parameters)"\s*:\s*')

_TOOLS_PROMPT = (
    "You can call the functions described below. To call one, answer with exactly\n"
    f'{CALL_START}\n{{"name": "<function name>", "arguments": {{<arguments as JSON>}}}}\n{CALL_END}\n'
    "Functions, as JSON schemas:\n<tools>\n{tools}\n</tools>"
)


def renders_tools(template: str) -> bool:
    """Whether a chat template renders the ``tools`` variable itself."""
    return "tools" in template


def _text(content: Any, where: str) -> str:
    """A message's text: its text parts joined; any other part is a 400 naming it (as the GLM
    engine's, :func:`sparkfold.glm.messages.normalise_messages`), never dropped unsaid."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind not in TEXT_PART_TYPES:
            raise RenderError(
                f"unsupported content part type {kind!r}; this model reads text parts only",
                param=f"{where}[{j}].type",
            )
        texts.append(str(part.get("text") or ""))
    return "".join(texts)


def _call_text(call: Mapping[str, Any]) -> str:
    function = call.get("function") or {}
    try:
        arguments = json.loads(function.get("arguments") or "{}")
    except ValueError:
        arguments = function.get("arguments")
    body = json.dumps({"name": function.get("name"), "arguments": arguments}, ensure_ascii=False)
    return f"{CALL_START}\n{body}\n{CALL_END}"


def template_messages(
    messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None, *, native_tools: bool
) -> list[dict[str, Any]]:
    """``messages`` (dumped chat messages) as a chat template can render them."""
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        item = {**message, "content": _text(message.get("content"), f"messages[{i}].content")}
        if not native_tools:
            calls = item.pop("tool_calls", None) or []
            if calls:
                item["content"] = "\n".join([item["content"], *map(_call_text, calls)]).strip()
            if item["role"] == "tool":
                item = {"role": "user", "content": f"<tool_response>\n{item['content']}\n</tool_response>"}
        out.append(item)
    if tools and not native_tools:
        listing = "\n".join(json.dumps(t.get("function", t), ensure_ascii=False) for t in tools)
        prompt = _TOOLS_PROMPT.replace("{tools}", listing)
        if out and out[0]["role"] in ("system", "developer"):
            out[0] = {**out[0], "role": "system", "content": f"{out[0]['content']}\n\n{prompt}".strip()}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


_SPACE = "[ \t\n\r]*"
_STRING = r'"(?:[^"\\]|\\.)*"'
_HEAD = re.compile(_SPACE + r"\{" + _SPACE + r'"name"' + _SPACE + ":" + _SPACE + f"({_STRING})")
_OPEN_STRING = r'"(?:[^"\\]|\\.)*\\?'
_KEY = re.compile(_SPACE + f"({_STRING})" + _SPACE + ":")


def _so_far(*parts: str) -> re.Pattern[str]:
    """A pattern for the texts that can still grow into ``parts`` written one after the other."""
    pattern = ""
    for part in reversed(parts):
        pattern = f"(?:{part}{pattern})?"
    return re.compile(pattern)


_HEAD_SO_FAR = _so_far(_SPACE, r"\{", _SPACE, '"', *"name", '"', _SPACE, ":", _SPACE, _OPEN_STRING)
_KEY_SO_FAR = _so_far(_SPACE, _OPEN_STRING, '"', _SPACE)


def _string(text: str) -> str | None:
    """The JSON string literal ``text``, decoded (None when it is not one)."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, str) else None


class _CallReader:
    """One ``<tool_call>`` body, streamed once it opens ``{"name": "<an offered name>"``.

    Until then the body is held; a body that turns out another shape, or names a tool not offered,
    is read whole when it ends (:attr:`streams` false). Then the outer object's keys are read as
    they come; the ``arguments`` (or ``parameters``) value is rewritten by
    :class:`~sparkfold.engines.json_text.JsonWriter` into the text the whole call gave, and an
    object streams; other keys' values are read and dropped, and so is anything after the object.
    """

    def __init__(self, index: int, names: set[str], earlier: Sequence[ParsedToolCall]) -> None:
        self.body = ""
        self._names = names
        self._gate = CallGate(index, earlier)
        self.streams: bool | None = None  # None: the head is still being written
        self.name = ""
        self.id = f"call_{uuid.uuid4().hex[:24]}"
        self._buffer = ""  # outer-object text not read yet
        self._state = "next"  # next (a "," or "}"), key, value, over
        self._value: JsonWriter | None = None
        self._arguments: JsonWriter | None = None
        self._written = ""  # the arguments' text so far

    def feed(self, text: str) -> list[ToolCallPiece]:
        self.body += text
        if self.streams is None:
            head = _HEAD.match(self.body)
            if head is None:
                if _HEAD_SO_FAR.fullmatch(self.body) is None:
                    self.streams = False
                return []
            self.name = _string(head.group(1)) or ""
            self.streams = self.name in self._names
            text = self.body[head.end() :]
        if not self.streams:
            return []
        self._buffer += text
        self._read()
        return self._release()

    def arguments(self, *, cut: bool) -> str:
        """The arguments' JSON text at the end of the call (``cut``: by the token budget)."""
        if self._arguments is None:
            return "" if cut else "{}"
        if self._arguments.done and self._arguments.first == '"' and not cut:
            return str(json.loads(self._written))  # arguments written as a JSON string: its text
        return self._written + self._arguments.flush()

    def release(self, arguments: str) -> list[ToolCallPiece]:
        self._written = arguments
        return self._gate.release(self.id, self.name, arguments, force=True)

    def repeats(self, arguments: str) -> bool:
        return self._gate.repeats(self.name, arguments)

    def _release(self) -> list[ToolCallPiece]:
        if self._arguments is not None and self._arguments.first not in ("", "{"):
            return []  # not an object: written whole at the end, as before
        return self._gate.release(self.id, self.name, self._written)

    def _read(self) -> None:
        while self._buffer and self._state != "over":
            if self._state == "value":
                assert self._value is not None
                written = self._value.feed(self._buffer)
                if self._value is self._arguments:
                    self._written += written
                self._buffer = ""
                if not (self._value.done or self._value.failed):
                    return
                self._buffer, self._state = self._value.rest, "next" if self._value.done else "over"
                continue
            stripped = self._buffer.lstrip(" \t\n\r")
            if not stripped:
                return
            if self._state == "next":
                self._state = "key" if stripped[0] == "," else "over"
                self._buffer = stripped[1:]
                continue
            key = _KEY.match(stripped)
            if key is None:
                if _KEY_SO_FAR.fullmatch(stripped) is None:
                    self._state = "over"
                return
            self._value = JsonWriter()
            if self._arguments is None and _string(key.group(1)) in ("arguments", "parameters"):
                self._arguments = self._value
            self._buffer, self._state = stripped[key.end() :], "value"


class ToolCallParser:
    """Content, and ``<tool_call>`` JSON calls to the offered tools, streamed as they are written.

    A reply's calls are bounded as the GLM parser bounds them (:mod:`sparkfold.glm.parser`,
    :class:`~sparkfold.glm.calls.CallGate`): a call that so far repeats an earlier one is held, one
    identical to an earlier one (same name, same arguments) is dropped and ends the reply, and so
    does the ``max_calls``-th call (forced calls: :func:`sparkfold.glm.chat.forced_call_cap`);
    :attr:`ended` tells the engine to stop.
    """

    def __init__(self, tools: Sequence[Mapping[str, Any]] | None, *, max_calls: int | None = None) -> None:
        self._names = {str((t.get("function") or {}).get("name")) for t in tools or []}
        self._max_calls = max_calls
        self._made: list[ParsedToolCall] = []
        self._pending = ""
        self._call: _CallReader | None = None
        self.tool_calls_made = False
        self.ended = False

    def feed(self, text: str) -> list[Delta]:
        if self.ended:  # the reply is over: what the model writes on is dropped
            return []
        self._pending += text
        return self._run(final=False)

    def finish(self, finish_reason: str | None = None) -> list[Delta]:
        if self._call is not None and finish_reason == "length":
            body, self._pending = self._pending, ""
            return self._close(body, cut=True)
        return self._run(final=True)

    def _run(self, *, final: bool) -> list[Delta]:
        out: list[Delta] = []
        while not self.ended:
            if self._call is None:
                at = self._pending.find(CALL_START)
                if at < 0:
                    keep = 0 if final else partial_tag(self._pending, (CALL_START,))
                    text, self._pending = (
                        self._pending[: len(self._pending) - keep],
                        self._pending[len(self._pending) - keep :],
                    )
                    if text:
                        out.append(Delta(content=text))
                    return out
                if self._pending[:at]:
                    out.append(Delta(content=self._pending[:at]))
                self._pending = self._pending[at + len(CALL_START) :]
                self._call = _CallReader(len(self._made), self._names, self._made)
            end = self._pending.find(CALL_END)
            if end < 0 and not final:
                keep = partial_tag(self._pending, (CALL_END,))
                body, self._pending = (
                    self._pending[: len(self._pending) - keep],
                    self._pending[len(self._pending) - keep :],
                )
                out += self._deltas(self._call.feed(body))
                return out
            body = self._pending if end < 0 else self._pending[:end]
            self._pending = "" if end < 0 else self._pending[end + len(CALL_END) :]
            out += self._close(body)
            if end < 0:
                break
        self._pending = ""
        return out

    def _close(self, body: str, *, cut: bool = False) -> list[Delta]:
        """The open call ends with ``body`` (``cut``: by the token budget)."""
        call, self._call = self._call, None
        assert call is not None
        out = self._deltas(call.feed(body))
        if call.streams:
            name, arguments = call.name, call.arguments(cut=cut)
        else:
            whole = (_cut_call if cut else _whole_call)(call.body, self._names)
            if whole is None:
                return [] if cut else [Delta(content=f"{CALL_START}{call.body}{CALL_END}")]
            name, arguments = whole
            call.name = name
        if not cut and call.repeats(arguments):  # the model repeats itself: the reply is over
            self.ended = True
            return out
        out += self._deltas(call.release(arguments))
        self._made.append(ParsedToolCall(len(self._made), call.id, name, arguments))
        self.ended = self._max_calls is not None and len(self._made) >= self._max_calls
        return out

    def _deltas(self, pieces: list[ToolCallPiece]) -> list[Delta]:
        if not pieces:
            return []
        self.tool_calls_made = True
        return [Delta(tool_calls=[p.delta() for p in pieces])]


def _whole_call(body: str, names: set[str]) -> tuple[str, str] | None:
    """The call a whole body holds (name, arguments' JSON text); None when it is none."""
    try:
        call = json.loads(body)
    except ValueError:
        return None
    if not isinstance(call, dict) or call.get("name") not in names:
        return None
    arguments = call.get("arguments", call.get("parameters", {}))
    return call["name"], arguments if isinstance(arguments, str) else json.dumps(
        arguments, ensure_ascii=False
    )


def _cut_call(body: str, names: set[str]) -> tuple[str, str] | None:
    """A call cut by the token budget, as far as it was written (none before its name is whole)."""
    try:
        head = from_json(body.strip(), allow_partial=True)  # a string still open is left out
    except ValueError:
        return None
    if not isinstance(head, dict) or head.get("name") not in names:
        return None
    found = _ARGUMENTS_KEY.search(body)
    return head["name"], body[found.end() :] if found else ""
