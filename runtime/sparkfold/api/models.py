"""The model routes (``GET /v1/models``, ``/v1/models/{id}``) for both dialects.

The list is the engine's (a card without ``created``, TensorFold's, gets one) and a card per
``[api] model_aliases`` entry (:class:`~sparkfold.api.model_names.ModelNames`). OpenAI clients get
it as it is. Anthropic's ``GET /v1/models`` answers a page (``data``, ``has_more``, ``first_id``, ``last_id``)
of ``ModelInfo`` objects (``type: "model"``, ``id``, ``display_name``, ``created_at`` as RFC 3339,
``lifecycle``): https://docs.anthropic.com/en/api/models-list. The path is OpenAI's too, so the
shape follows the client: the Anthropic SDKs send ``anthropic-version`` on every request.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from sparkfold.api.errors import ApiError, NotFound
from sparkfold.api.model_names import ModelNames
from sparkfold.api.upstream import Engine
from sparkfold.protocol import ModelList

__all__ = ["ModelsServing", "model_info", "model_page", "wants_anthropic"]


class ModelsServing:
    """The served model and its aliases, in the dialect of the client that asks."""

    def __init__(self, *, engine: Engine, served_name: str, names: ModelNames | None = None) -> None:
        self.engine = engine
        self.served_name = served_name
        self.names = names or ModelNames(served_name)

    async def models(self, *, anthropic: bool = False) -> dict[str, Any] | ApiError:
        """The engine's model list, typed, and a card per alias; a page of ``ModelInfo`` for an
        Anthropic client."""
        try:
            listed = await self.engine.get_reply("/v1/models", ModelList)
        except ApiError as error:
            return error
        cards = self.names.with_aliases(listed.model_dump(mode="json", exclude_none=True))
        return model_page(cards) if anthropic else cards

    async def model(self, model_id: str, *, anthropic: bool = False) -> dict[str, Any] | ApiError:
        """One model card of the list (an alias: the served card under its name), or 404."""
        listed = await self.models()
        if isinstance(listed, ApiError):
            return listed
        wanted = self.names.engine_name(model_id)
        for card in listed.get("data") or []:
            if isinstance(card, dict) and card.get("id") == wanted:
                found = {**card, "id": model_id}
                return model_info(found) if anthropic else found
        return NotFound(
            f"The model `{model_id}` does not exist; this server serves `{self.served_name}`.",
            param="model",
            code="model_not_found",
        )


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
