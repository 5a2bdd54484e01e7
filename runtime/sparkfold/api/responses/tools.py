"""Responses ``tools`` as the chat tools the model is offered, and its calls named back.

The kinds are those of the openai SDK's ``types/responses/tool.py`` (its ``Tool`` union):

- ``function``: offered as it is.
- ``namespace`` (``types/responses/namespace_tool.py``: a ``name`` and the ``tools`` inside it):
  each ``function`` inside is offered as ``{namespace}.{name}`` (the one name the model sees and
  writes); a call to it comes back as OpenAI returns one, with ``name`` and ``namespace`` apart
  (``types/responses/response_function_tool_call.py``), and a ``function_call`` item sent back
  with its ``namespace`` names that function again.
- every other kind (``web_search``, ``file_search``, ``code_interpreter``, ``mcp``, ``custom`` …,
  :data:`NOT_OFFERED`) is run by OpenAI's servers or needs a call shape that is not a function's:
  it is not offered to the model, and is named in the reply's header and a log line
  (:mod:`sparkfold.api.ignored_tools`), so that a client that sends its usual list (Codex sends
  ``web_search``) still works.
  A ``custom`` tool inside a namespace is left out the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sparkfold.api.errors import InvalidRequest

__all__ = [
    "NAMESPACE_SEPARATOR",
    "NOT_OFFERED",
    "OFFERED",
    "ResponsesTools",
    "responses_tools",
]

NAMESPACE_SEPARATOR = "."
OFFERED = ("function", "namespace")
NOT_OFFERED = (
    "apply_patch",
    "code_interpreter",
    "computer",
    "computer_use_preview",
    "custom",
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


@dataclass
class ResponsesTools:
    """The chat tools to offer, what was left out, and which offered names belong to a namespace."""

    chat: list[dict[str, Any]] | None = None
    ignored: list[str] = field(default_factory=list)
    namespaced: dict[str, tuple[str, str]] = field(default_factory=dict)  # offered name: (namespace, name)

    def call_fields(self, offered: str) -> dict[str, str]:
        """A ``function_call`` item's ``name`` (and ``namespace``) for a call the model wrote."""
        if offered in self.namespaced:
            namespace, name = self.namespaced[offered]
            return {"name": name, "namespace": namespace}
        return {"name": offered}


def offered_name(name: str, namespace: Any) -> str:
    """The name the model sees for ``name`` of ``namespace`` (none: the name itself)."""
    return f"{namespace}{NAMESPACE_SEPARATOR}{name}" if isinstance(namespace, str) and namespace else name


def _label(tool: dict[str, Any], prefix: str = "") -> str:
    """How an ignored tool is named in the header and the log: its kind, and its name if it has one."""
    name = tool.get("name") or tool.get("server_label")
    return f"{prefix}{tool.get('type')}" + (f":{name}" if isinstance(name, str) and name else "")


def _function(tool: dict[str, Any], name: str) -> dict[str, Any]:
    function = {k: tool[k] for k in ("description", "parameters") if k in tool}
    return {"type": "function", "function": {"name": name, **function}}


def responses_tools(tools: list[dict[str, Any]] | None) -> ResponsesTools | InvalidRequest:
    """The request's ``tools`` sorted into offered chat tools and ignored ones, or a 400 naming a
    malformed entry (a function without a name, a namespace without tools, an unknown kind)."""
    if tools is None:
        return ResponsesTools()
    out = ResponsesTools(chat=[])
    assert out.chat is not None
    for i, tool in enumerate(tools):
        kind, where = tool.get("type"), f"tools[{i}]"
        if kind == "function":
            if not isinstance(tool.get("name"), str) or not tool["name"]:
                return InvalidRequest(f"{where}: a function tool needs a name", param=where)
            out.chat.append(_function(tool, tool["name"]))
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
                if not isinstance(member.get("name"), str) or not member["name"]:
                    return InvalidRequest(f"{at}: a tool in a namespace needs a name", param=at)
                if member["type"] == "custom":
                    out.ignored.append(_label(member, f"{namespace}{NAMESPACE_SEPARATOR}"))
                    continue
                offered = offered_name(member["name"], namespace)
                out.namespaced[offered] = (namespace, member["name"])
                out.chat.append(_function(member, offered))
        elif kind in NOT_OFFERED:
            out.ignored.append(_label(tool))
        else:
            known = ", ".join(OFFERED + NOT_OFFERED)
            return InvalidRequest(f"{where}: unknown tool type {kind!r}; the API's are {known}", param=where)
    names = [tool["function"]["name"] for tool in out.chat]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        return InvalidRequest(f"tools: more than one tool is offered as {twice[0]!r}", param="tools")
    return out
