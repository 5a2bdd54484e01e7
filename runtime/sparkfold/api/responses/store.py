"""A bounded in-memory store of finished responses (for GET/DELETE and ``previous_response_id``)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

__all__ = ["DEFAULT_MAX_ENTRIES", "ResponseStore"]

DEFAULT_MAX_ENTRIES = 1024


class ResponseStore:
    """Keeps the newest ``max_entries`` responses with the chat messages that led to them."""

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be positive")
        self.max_entries = max_entries
        self._items: OrderedDict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = OrderedDict()

    def __repr__(self) -> str:
        return f"ResponseStore({len(self._items)}/{self.max_entries})"

    def __len__(self) -> int:
        return len(self._items)

    def put(self, response: dict[str, Any], conversation: list[dict[str, Any]]) -> None:
        self._items[response["id"]] = (response, conversation)
        self._items.move_to_end(response["id"])
        while len(self._items) > self.max_entries:
            self._items.popitem(last=False)

    def get(self, response_id: str) -> dict[str, Any] | None:
        item = self._items.get(response_id)
        return item[0] if item else None

    def conversation(self, response_id: str) -> list[dict[str, Any]] | None:
        item = self._items.get(response_id)
        return item[1] if item else None

    def delete(self, response_id: str) -> bool:
        return self._items.pop(response_id, None) is not None
