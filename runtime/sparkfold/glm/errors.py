"""Errors of the GLM protocol layer; every one is a client mistake (HTTP 400).

::

    GlmError                 a request the GLM layer cannot serve; .param names the field
    ├── RenderError          messages or tools that cannot be rendered into a prompt
    ├── GrammarError         a structured-output request xgrammar cannot compile
    │   └── GrammarDeadEnd   a reply where the grammar allowed no next token: it ends with this
    └── MediaError           a picture or video that is missing, too big, or not allowed

A server maps any :class:`GlmError` to ``400`` with ``{"error": {"message", "type", "param"}}``.
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["GlmError", "GrammarDeadEnd", "GrammarError", "MediaError", "RenderError", "without_addresses"]

_OBJECT_REPR = re.compile(r"\s*<[^<>]* at 0x[0-9a-fA-F]+>")
_ADDRESS = re.compile(r"\s*(?:at )?0x[0-9a-fA-F]+")


def without_addresses(text: str) -> str:
    """A library's message without object reprs (PIL's ``<_io.BytesIO object at 0x7f…>``) or bare
    addresses: they tell a client nothing, and an attacker where this process keeps its memory."""
    return _ADDRESS.sub("", _OBJECT_REPR.sub("", text)).strip()


class GlmError(ValueError):
    """A request the GLM layer cannot serve. ``param`` names the offending request field."""

    status = 400
    type = "invalid_request_error"

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def __reduce__(self) -> tuple[Any, tuple[str, str | None]]:
        return type(self), (self.message, self.param)  # param kept across processes (an engine core)


class RenderError(GlmError):
    """Messages or tools that cannot be rendered into a GLM prompt."""


class GrammarError(GlmError):
    """A ``response_format`` / ``guided_*`` constraint that cannot be compiled."""


class GrammarDeadEnd(GrammarError):
    """A step of a reply where the grammar allowed no token: the reply ends with this error."""


class MediaError(GlmError):
    """An image or video part that cannot be used."""
