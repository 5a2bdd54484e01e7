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
is content, a complete call whose name was offered becomes a tool-call delta, anything else stays
content; a call cut by ``max_tokens`` comes back as far as it was written once its offered name is
complete (its ``arguments`` the unfinished JSON text after ``"arguments":``), never dropped. It is
written here because no maintained library parses this form incrementally without bringing a
serving stack with it.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic_core import from_json

from sparkfold.glm.errors import RenderError
from sparkfold.glm.messages import TEXT_PART_TYPES
from sparkfold.protocol import Delta, ToolCallDelta

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


def _partial(text: str, tag: str) -> int:
    """Length of the longest suffix of ``text`` that could grow into ``tag``."""
    for size in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-size:]):
            return size
    return 0


class ToolCallParser:
    """Content, and whole ``<tool_call>`` JSON calls to the offered tools.

    A reply's calls are bounded as the GLM parser bounds them (:mod:`sparkfold.glm.parser`): a
    call identical to an earlier one (same name, same arguments) is dropped and ends the reply,
    and so does the ``max_calls``-th call (forced calls:
    :func:`sparkfold.glm.serving.forced_call_cap`); :attr:`ended` tells the engine to stop.
    """

    def __init__(self, tools: Sequence[Mapping[str, Any]] | None, *, max_calls: int | None = None) -> None:
        self._names = {str((t.get("function") or {}).get("name")) for t in tools or []}
        self._max_calls = max_calls
        self._made: list[tuple[str, Any]] = []
        self._pending = ""
        self._in_call = False
        self._index = 0
        self.tool_calls_made = False
        self.ended = False

    def feed(self, text: str) -> list[Delta]:
        if self.ended:  # the reply is over: what the model writes on is dropped
            return []
        self._pending += text
        return self._run(final=False)

    def finish(self, finish_reason: str | None = None) -> list[Delta]:
        if self._in_call and finish_reason == "length":
            body, self._pending, self._in_call = self._pending, "", False
            return self._cut_call(body)
        return self._run(final=True)

    def _cut_call(self, body: str) -> list[Delta]:
        """A call cut by the token budget, as far as it was written (none before its name is whole)."""
        try:
            head = from_json(body.strip(), allow_partial=True)  # a string still open is left out
        except ValueError:
            return []
        if not isinstance(head, dict) or head.get("name") not in self._names:
            return []
        found = _ARGUMENTS_KEY.search(body)
        return [self._delta(head["name"], body[found.end() :] if found else "")]

    def _run(self, *, final: bool) -> list[Delta]:
        out: list[Delta] = []
        while True:
            if not self._in_call:
                at = self._pending.find(CALL_START)
                if at < 0:
                    keep = 0 if final else _partial(self._pending, CALL_START)
                    text, self._pending = (
                        self._pending[: len(self._pending) - keep],
                        self._pending[len(self._pending) - keep :],
                    )
                    if text:
                        out.append(Delta(content=text))
                    return out
                if self._pending[:at]:
                    out.append(Delta(content=self._pending[:at]))
                self._pending, self._in_call = self._pending[at + len(CALL_START) :], True
            end = self._pending.find(CALL_END)
            if end < 0 and not final:
                return out
            body = self._pending if end < 0 else self._pending[:end]
            self._pending = "" if end < 0 else self._pending[end + len(CALL_END) :]
            self._in_call = False
            call = self._call(body)
            if call is not None:
                out.append(call)
            if end < 0 or self.ended:
                self._pending = ""
                return out

    def _call(self, body: str) -> Delta | None:
        """The call ``body`` holds, as a delta (text when it is none); None when it repeats one."""
        try:
            call = json.loads(body)
        except ValueError:
            call = None
        if not isinstance(call, dict) or call.get("name") not in self._names:
            return Delta(content=f"{CALL_START}{body}{CALL_END}")
        arguments = call.get("arguments", call.get("parameters", {}))
        if (call["name"], arguments) in self._made:  # the model repeats itself: the reply is over
            self.ended = True
            return None
        self._made.append((call["name"], arguments))
        self.ended = self._max_calls is not None and len(self._made) >= self._max_calls
        text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
        return self._delta(call["name"], text)

    def _delta(self, name: str, arguments: str) -> Delta:
        self.tool_calls_made = True
        delta = ToolCallDelta(
            index=self._index,
            id=f"call_{uuid.uuid4().hex[:24]}",
            type="function",
            function={"name": name, "arguments": arguments},
        )
        self._index += 1
        return Delta(tool_calls=[delta])
