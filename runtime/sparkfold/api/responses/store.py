"""A bounded in-memory store of finished responses (for GET/DELETE and ``previous_response_id``).

Bounded three ways: a count, the bytes of one entry and the bytes of all of them (an entry's size
is the length of its JSON: the response and the conversation behind it), as ``[api]`` sets them
(:meth:`ResponseStore.from_settings`). A response answered but too large to keep is remembered by
its id alone, so that continuing it says why it is missing. Pictures and videos in
the conversation are replaced by a text note before it is kept, so a continuation costs text, not
media. Every entry belongs to the tenant that made it (the digest of its API key, see
:mod:`sparkfold.api.keys`); another tenant cannot see, continue or delete it, and is told it does
not exist.
"""

from __future__ import annotations

import json
import logging
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sparkfold.units import MIB

if TYPE_CHECKING:
    from sparkfold.config import ApiSettings

__all__ = ["MEDIA_NOTE", "ResponseStore"]

log = logging.getLogger(__name__)

MEDIA_PARTS = frozenset({"image_url", "video_url", "input_image", "image", "input_file"})
MEDIA_NOTE = "[a picture or video was sent here; the stored conversation does not keep it]"


@dataclass(frozen=True)
class _Entry:
    tenant: str
    response: dict[str, Any]
    conversation: list[dict[str, Any]]
    size: int


def _without_media(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    if not isinstance(content, list):
        return message
    parts = [
        {"type": "text", "text": MEDIA_NOTE} if isinstance(p, dict) and p.get("type") in MEDIA_PARTS else p
        for p in content
    ]
    return {**message, "content": parts}


class ResponseStore:
    """Keeps the newest responses, with the chat messages that led to them, per tenant."""

    def __init__(self, max_entries: int, *, max_entry_bytes: int, max_bytes: int) -> None:
        if min(max_entries, max_entry_bytes, max_bytes) < 1:
            raise ValueError("max_entries, max_entry_bytes and max_bytes must be positive")
        self.max_entries = max_entries
        self.max_entry_bytes = max_entry_bytes
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: OrderedDict[str, _Entry] = OrderedDict()
        self._refused: OrderedDict[str, tuple[str, int]] = OrderedDict()  # id: (tenant, size)

    @classmethod
    def from_settings(cls, api: ApiSettings) -> ResponseStore:
        """The store ``[api]`` asks for: ``max_stored_responses``, ``max_stored_response_mib`` and
        ``max_store_mib``."""
        return cls(
            api.max_stored_responses,
            max_entry_bytes=int(api.max_stored_response_mib * MIB),
            max_bytes=int(api.max_store_mib * MIB),
        )

    def __repr__(self) -> str:
        return f"ResponseStore({len(self._items)}/{self.max_entries}, {self.bytes}/{self.max_bytes} bytes)"

    def __len__(self) -> int:
        return len(self._items)

    def put(self, response: dict[str, Any], conversation: list[dict[str, Any]], *, tenant: str = "") -> bool:
        """Keep ``response``; ``False`` (and nothing kept) when it alone is past ``max_entry_bytes``."""
        kept = [_without_media(m) for m in conversation]
        size = len(json.dumps(response, default=str)) + len(json.dumps(kept, default=str))
        if size > self.max_entry_bytes:
            log.info("response not stored: larger than api.max_stored_response_mib", extra={"bytes": size})
            self._refused[response["id"]] = (tenant, size)
            while len(self._refused) > self.max_entries:
                self._refused.popitem(last=False)
            return False
        if (replaced := self._items.pop(response["id"], None)) is not None:
            self.bytes -= replaced.size
        self._items[response["id"]] = _Entry(tenant, response, kept, size)
        self.bytes += size
        while len(self._items) > self.max_entries or self.bytes > self.max_bytes:
            _, dropped = self._items.popitem(last=False)
            self.bytes -= dropped.size
        return True

    def _entry(self, response_id: str, tenant: str) -> _Entry | None:
        entry = self._items.get(response_id)
        return entry if entry is not None and entry.tenant == tenant else None

    def refused(self, response_id: str, *, tenant: str = "") -> int | None:
        """The size in bytes of ``response_id`` when it was answered but not kept for its size."""
        tenant_and_size = self._refused.get(response_id)
        return tenant_and_size[1] if tenant_and_size and tenant_and_size[0] == tenant else None

    def get(self, response_id: str, *, tenant: str = "") -> dict[str, Any] | None:
        entry = self._entry(response_id, tenant)
        return entry.response if entry else None

    def conversation(self, response_id: str, *, tenant: str = "") -> list[dict[str, Any]] | None:
        entry = self._entry(response_id, tenant)
        return entry.conversation if entry else None

    def delete(self, response_id: str, *, tenant: str = "") -> bool:
        if self._entry(response_id, tenant) is None:
            return False
        self.bytes -= self._items.pop(response_id).size
        return True
