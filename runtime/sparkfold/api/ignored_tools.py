"""Tools a request offers that this server cannot run: left out of the prompt, and said.

Both dialects define tools that run on their vendor's servers or that the model calls in a shape
other than a function's (Responses ``web_search``, ``mcp`` …; Messages ``web_search_20250305``,
``bash_20250124`` …). Clients send them by default, so refusing them
would stop a client before its first turn: they are not offered to the model, and the reply says
which in the :data:`IGNORED_TOOLS_HEADER` header, with a log line.
"""

from __future__ import annotations

import logging

from sparkfold.api.context import CallContext

__all__ = ["IGNORED_TOOLS_HEADER", "IGNORED_TOOLS_SHOWN", "say_ignored_tools"]

log = logging.getLogger(__name__)

IGNORED_TOOLS_HEADER = "x-sparkfold-ignored-tools"
IGNORED_TOOLS_SHOWN = 16
"""Ignored tools the header names (then ``...``): a header stays short."""


def _printable(label: str) -> str:
    """``label`` as printable ASCII (a header value may hold nothing else: ``\n`` would end it)."""
    return "".join(c if " " <= c <= "~" else c.encode("unicode_escape").decode("ascii") for c in label)


def _header_text(labels: list[str]) -> str:
    """``labels`` as one header value: printable ASCII, comma-separated, at most ``IGNORED_TOOLS_SHOWN``."""
    shown = [_printable(label)[:64] for label in labels]
    more = ", ..." if len(shown) > IGNORED_TOOLS_SHOWN else ""
    return ", ".join(shown[:IGNORED_TOOLS_SHOWN]) + more


def say_ignored_tools(labels: list[str], call: CallContext) -> None:
    """Name the tools left out (``labels``: each its kind, and its name when it has one) in the
    reply's header and a log line; nothing when there are none."""
    if not labels:
        return
    call.headers[IGNORED_TOOLS_HEADER] = _header_text(labels)
    log.info(
        "tools not offered to the model (this server cannot run them)",
        extra={"request_id": call.request_id, "tools": labels[:IGNORED_TOOLS_SHOWN]},
    )
