"""The model list in Anthropic's shape, for Anthropic clients.

Anthropic's ``GET /v1/models`` answers a page (``data``, ``has_more``, ``first_id``, ``last_id``)
of ``ModelInfo`` objects (``type: "model"``, ``id``, ``display_name``, ``created_at`` as RFC 3339,
``lifecycle``): https://docs.anthropic.com/en/api/models-list. The path is OpenAI's too, so the
shape follows the client: the Anthropic SDKs send ``anthropic-version`` on every request.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

__all__ = ["model_info", "model_page", "wants_anthropic"]


def wants_anthropic(headers: Mapping[str, str]) -> bool:
    return "anthropic-version" in headers


def model_info(card: dict[str, Any]) -> dict[str, Any]:
    """One OpenAI model card (the engine's, typed by ``ModelCard``) as a ``ModelInfo``."""
    created = datetime.fromtimestamp(int(card.get("created") or 0), UTC)
    info: dict[str, Any] = {
        "type": "model",
        "id": card["id"],
        "display_name": card["id"],
        "created_at": created.isoformat().replace("+00:00", "Z"),
        "lifecycle": "active",
    }
    if isinstance(card.get("max_model_len"), int):
        info["max_input_tokens"] = card["max_model_len"]
    return info


def model_page(listed: dict[str, Any]) -> dict[str, Any]:
    """The engine's whole list (one page: it is one model and its aliases)."""
    data = [model_info(card) for card in listed.get("data") or []]
    return {
        "data": data,
        "has_more": False,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
    }
