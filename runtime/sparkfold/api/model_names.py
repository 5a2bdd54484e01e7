"""The model names the gateway answers to: the served one, and ``[api] model_aliases``.

Coding agents ask for their own vendor's models by default (Claude Code ``claude-…``, including its
background calls to a smaller model; Codex ``gpt-5…``). ``model_aliases`` lists glob patterns
(:func:`fnmatch.fnmatchcase`: ``*``, ``?``, ``[…]``, case-sensitive) of names answered by the served
model: a request naming one is sent to the engine as the served name, on every route that takes a
model. Any other name goes to the engine unchanged, which answers it with its 404 naming the served
model. ``/v1/models`` lists the served model, then one entry per alias as written (a pattern's id
keeps its ``*``): what answers.
"""

from __future__ import annotations

from collections.abc import Sequence
from fnmatch import fnmatchcase
from typing import Any

__all__ = ["ModelNames"]


class ModelNames:
    def __init__(self, served: str, aliases: Sequence[str] = ()) -> None:
        self.served = served
        self.aliases = tuple(aliases)

    def __repr__(self) -> str:
        return f"ModelNames({self.served!r}, aliases={list(self.aliases)!r})"

    def engine_name(self, name: Any) -> Any:
        """``name`` as the engine knows it: the served name for an alias, else ``name`` itself."""
        if isinstance(name, str) and name != self.served and any(fnmatchcase(name, a) for a in self.aliases):
            return self.served
        return name

    def to_engine(self, body: dict[str, Any]) -> dict[str, Any]:
        """``body`` (an engine-bound request) with its ``model`` named as the engine knows it, in place."""
        if "model" in body:
            body["model"] = self.engine_name(body["model"])
        return body

    def with_aliases(self, listed: dict[str, Any]) -> dict[str, Any]:
        """The engine's model list followed by a card per alias (the served card's fields, the
        alias as ``id``), so a client that checks the list finds the name it will ask for."""
        cards = listed.get("data") or []
        served = next((c for c in cards if isinstance(c, dict) and c.get("id") == self.served), None)
        if served is None or not self.aliases:
            return listed
        return {**listed, "data": [*cards, *({**served, "id": alias} for alias in self.aliases)]}
