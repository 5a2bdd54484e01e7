"""Responses ``tools`` as the chat tools the model is offered, and its calls named back.

The kinds are those of the openai SDK's ``types/responses/tool.py`` (its ``Tool`` union):

- ``function``: offered as it is.
- ``custom`` (``types/responses/custom_tool.py``: a freeform tool, its input one text, optionally
  of a ``format``: ``text``, or a ``grammar`` in ``lark`` or ``regex`` syntax): offered as a
  function of one string parameter, ``input`` (:data:`CUSTOM_INPUT`), that carries the text; the
  grammar is shown to the model in that parameter's description, and a ``regex`` one is also its
  JSON-schema ``pattern``, which the engines enforce when the call is forced (``tool_choice``
  required or naming it: ``sparkfold.glm.grammar.tool_constraint``). A ``lark`` grammar is not
  enforced, and the log says so: the engines constrain a call through its tool's JSON schema,
  which has no keyword for one. A call comes back as a ``custom_tool_call`` item with its
  ``input`` (``types/responses/response_custom_tool_call.py``); one sent back (and its
  ``custom_tool_call_output``) becomes that function call again.
- ``namespace`` (``types/responses/namespace_tool.py``: a ``name`` and the ``function`` and
  ``custom`` tools inside it): each tool inside is offered as ``{namespace}.{name}`` (the one name
  the model sees and writes); a call to it comes back as OpenAI returns one, with ``name`` and
  ``namespace`` apart, and an item sent back with its ``namespace`` names that tool again.
- every other kind (``web_search``, ``file_search``, ``code_interpreter``, ``mcp`` …,
  :data:`NOT_OFFERED`) is run by OpenAI's servers: it is not offered to the model, and is named in
  the reply's header and a log line (:mod:`sparkfold.api.ignored_tools`), so that a client that
  sends its usual list (Codex sends ``web_search``) still works.

An ``additional_tools`` input item (``types/responses/response_input_item.py``,
``AdditionalTools``: tools made available from that item on) adds its tools to the request's:
GLM's template lists every tool before the conversation, so they are offered from the start.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from sparkfold.api.errors import InvalidRequest

__all__ = [
    "CUSTOM_INPUT",
    "NAMESPACE_SEPARATOR",
    "NOT_OFFERED",
    "OFFERED",
    "ResponsesTools",
    "custom_arguments",
    "custom_input",
    "offered_name",
    "responses_tools",
]

NAMESPACE_SEPARATOR = "."
CUSTOM_INPUT = "input"
"""The one parameter of the function a ``custom`` tool is offered as: its freeform input."""
OFFERED = ("function", "custom", "namespace")
NOT_OFFERED = (
    "apply_patch",
    "code_interpreter",
    "computer",
    "computer_use_preview",
    "file_search",
    "image_generation",
    "local_shell",
    "mcp",
    "programmatic_tool_calling",
    "shell",
    "tool_search",
    "web_search",
    "web_search_2025_08_26",
    "web_search_preview",
    "web_search_preview_2025_03_11",
)
"""Tool kinds of the Responses API that are accepted and not offered to the model."""
GRAMMAR_SYNTAXES = ("lark", "regex")


@dataclass(frozen=True)
class ToolName:
    """What an offered name stands for: the tool's ``name``, its ``namespace``, and whether it is a
    ``custom`` tool (its calls are ``custom_tool_call`` items)."""

    name: str
    namespace: str | None = None
    custom: bool = False


@dataclass
class ResponsesTools:
    """The chat tools to offer, what was left out, and what each offered name stands for."""

    chat: list[dict[str, Any]] | None = None
    ignored: list[str] = field(default_factory=list)
    names: dict[str, ToolName] = field(default_factory=dict)  # offered name: the tool
    unenforced: list[str] = field(default_factory=list)
    """Custom tools whose grammar is shown to the model but not enforced (``lark``)."""

    def call_fields(self, offered: str) -> dict[str, str]:
        """A call item's ``name`` (and ``namespace``) for a call the model wrote."""
        tool = self.names.get(offered, ToolName(offered))
        return {"name": tool.name} | ({"namespace": tool.namespace} if tool.namespace else {})

    def is_custom(self, offered: str) -> bool:
        return offered in self.names and self.names[offered].custom


def offered_name(name: str, namespace: Any) -> str:
    """The name the model sees for ``name`` of ``namespace`` (none: the name itself)."""
    return f"{namespace}{NAMESPACE_SEPARATOR}{name}" if isinstance(namespace, str) and namespace else name


def custom_arguments(text: str) -> str:
    """The arguments of the function call a ``custom_tool_call``'s ``input`` stands for."""
    return json.dumps({CUSTOM_INPUT: text}, ensure_ascii=False)


def custom_input(arguments: str) -> str:
    """A ``custom_tool_call``'s ``input`` from the arguments the model wrote: its ``input`` string,
    or the text itself where it is not such an object (a call cut short)."""
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return arguments
    if isinstance(parsed, dict) and isinstance(parsed.get(CUSTOM_INPUT), str):
        return str(parsed[CUSTOM_INPUT])
    return "" if parsed == {} else arguments


def _label(tool: dict[str, Any], prefix: str = "") -> str:
    """How a tool is named in the header and the log: its kind, and its name if it has one."""
    name = tool.get("name") or tool.get("server_label")
    return f"{prefix}{tool.get('type')}" + (f":{name}" if isinstance(name, str) and name else "")


def _function(tool: dict[str, Any], name: str) -> dict[str, Any]:
    function = {k: tool[k] for k in ("description", "parameters") if k in tool}
    return {"type": "function", "function": {"name": name, **function}}


def _custom_input_schema(fmt: Any, where: str) -> tuple[dict[str, Any], bool] | InvalidRequest:
    """The ``input`` parameter's schema for a custom tool's ``format``, and whether its grammar goes
    unenforced; or a 400 naming a malformed format."""
    text = {"type": "string", "description": "The tool's input: free text, not JSON."}
    if fmt is None or (isinstance(fmt, dict) and fmt.get("type") == "text"):
        return text, False
    at = f"{where}.format"
    if not isinstance(fmt, dict) or fmt.get("type") != "grammar":
        return InvalidRequest(f'{at}: a custom tool\'s format is {{"type": "text"}} or a grammar', param=at)
    syntax, definition = fmt.get("syntax"), fmt.get("definition")
    if syntax not in GRAMMAR_SYNTAXES or not isinstance(definition, str) or not definition:
        return InvalidRequest(
            f"{at}: a grammar format needs a syntax ({' or '.join(GRAMMAR_SYNTAXES)}) and a definition",
            param=at,
        )
    if syntax == "regex":
        described = f"The tool's input: free text, not JSON, matching the regular expression {definition}"
        return {"type": "string", "description": described, "pattern": definition}, False
    described = f"The tool's input: free text, not JSON, following this Lark grammar:\n{definition}"
    return {"type": "string", "description": described}, True


def _custom(tool: dict[str, Any], offered: str, where: str) -> tuple[dict[str, Any], bool] | InvalidRequest:
    """The function a ``custom`` tool is offered as, and whether its grammar goes unenforced."""
    schema = _custom_input_schema(tool.get("format"), where)
    if isinstance(schema, InvalidRequest):
        return schema
    parameters = {"type": "object", "properties": {CUSTOM_INPUT: schema[0]}, "required": [CUSTOM_INPUT]}
    return _function({**tool, "parameters": parameters}, offered), schema[1]


def _entries(tools: list[Any] | None, items: Any) -> list[tuple[str, Any]] | InvalidRequest:
    """Every tool offered, with where it stands: the request's ``tools``, then those of each
    ``additional_tools`` input item."""
    entries = [(f"tools[{i}]", tool) for i, tool in enumerate(tools or [])]
    for i, item in enumerate(items if isinstance(items, list) else []):
        if not isinstance(item, dict) or item.get("type") != "additional_tools":
            continue
        where = f"input[{i}]"
        if item.get("role", "developer") != "developer" or not isinstance(item.get("tools"), list):
            return InvalidRequest(
                f'{where}: an additional_tools item needs role "developer" and a list of tools', param=where
            )
        entries += [(f"{where}.tools[{j}]", tool) for j, tool in enumerate(item["tools"])]
    return entries


def responses_tools(tools: list[Any] | None, items: Any = None) -> ResponsesTools | InvalidRequest:
    """The request's ``tools`` and those of its ``additional_tools`` input ``items``, sorted into
    offered chat tools and ignored ones; or a 400 naming a malformed entry (a function without a
    name, a namespace without tools, an unknown kind, a custom tool's bad format)."""
    entries = _entries(tools, items)
    if isinstance(entries, InvalidRequest):
        return entries
    if tools is None and not entries:
        return ResponsesTools()
    out = ResponsesTools(chat=[])
    assert out.chat is not None

    def offer(tool: dict[str, Any], where: str, namespace: str | None = None) -> InvalidRequest | None:
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            return InvalidRequest(f"{where}: a {tool.get('type')} tool needs a name", param=where)
        offered = offered_name(tool["name"], namespace)
        custom = tool.get("type") == "custom"
        if custom:
            function = _custom(tool, offered, where)
            if isinstance(function, InvalidRequest):
                return function
            out.chat.append(function[0])  # type: ignore[union-attr]
            if function[1]:
                out.unenforced.append(offered)
        else:
            out.chat.append(_function(tool, offered))  # type: ignore[union-attr]
        if custom or namespace:
            out.names[offered] = ToolName(tool["name"], namespace, custom)
        return None

    for where, tool in entries:
        kind = tool.get("type") if isinstance(tool, dict) else None
        refused: InvalidRequest | None = None
        if kind in ("function", "custom"):
            refused = offer(tool, where)
        elif kind == "namespace":
            namespace, inner = tool.get("name"), tool.get("tools")
            if not isinstance(namespace, str) or not namespace or not isinstance(inner, list):
                return InvalidRequest(
                    f"{where}: a namespace tool needs a name and a list of tools", param=where
                )
            for j, member in enumerate(inner):
                at = f"{where}.tools[{j}]"
                if not isinstance(member, dict) or member.get("type") not in ("function", "custom"):
                    return InvalidRequest(f"{at}: a namespace holds function or custom tools", param=at)
                refused = refused or offer(member, at, namespace)
        elif kind in NOT_OFFERED:
            out.ignored.append(_label(tool))
        else:
            known = ", ".join(OFFERED + NOT_OFFERED)
            return InvalidRequest(f"{where}: unknown tool type {kind!r}; the API's are {known}", param=where)
        if refused is not None:
            return refused
    names = [tool["function"]["name"] for tool in out.chat]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        return InvalidRequest(f"tools: more than one tool is offered as {twice[0]!r}", param="tools")
    return out
