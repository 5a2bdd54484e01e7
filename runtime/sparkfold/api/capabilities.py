"""What the engine behind the gateway can do beyond TensorFold's contract, asked when a request needs it.

Our engine servers describe themselves on their ``/v1/models`` card (``capabilities``: backend,
``logprobs``, ``n``); TensorFold's card has no such block, so the gateway takes it for "none of
it". A request for several choices, a list of prompts or log-probabilities is refused before it
takes a lane when the engine cannot serve it, with a 400 that names the engine.
"""

from __future__ import annotations

from typing import Any

from sparkfold.api.errors import ApiError, ClientError, InvalidRequest
from sparkfold.api.upstream import Engine
from sparkfold.protocol import EngineCapabilities

__all__ = ["refuse_unsupported"]


async def _capabilities(engine: Engine) -> EngineCapabilities | str:
    """The engine's capabilities, or its name when it declares none."""
    listed = await engine.get_json("/v1/models")
    cards = [c for c in listed.get("data") or [] if isinstance(c, dict)]
    card: dict[str, Any] = cards[0] if cards else {}
    raw = card.get("capabilities")
    if isinstance(raw, dict):
        try:
            return EngineCapabilities.model_validate(raw)
        except ValueError:
            pass
    return str(card.get("owned_by") or "upstream")


async def refuse_unsupported(
    engine: Engine, *, n: int | None, logprobs: Any, top_logprobs: Any, prompts: int = 1
) -> ApiError | None:
    """A 400 naming the engine when it cannot give what the request asks for, else ``None``."""
    wants_logprobs = logprobs not in (None, False) or top_logprobs not in (None, 0)
    wants_choices = (n or 1) != 1 or prompts != 1
    if not (wants_logprobs or wants_choices):
        return None
    try:
        found = await _capabilities(engine)
    except ApiError as error:
        return error
    backend = found.backend if isinstance(found, EngineCapabilities) else found
    can_choose = isinstance(found, EngineCapabilities) and found.n
    if wants_choices and not can_choose:
        if (n or 1) != 1:
            return InvalidRequest(
                f"n must be 1 with the {backend} engine (it returns one choice per request); got {n}",
                param="n",
            )
        return InvalidRequest(
            f"the {backend} engine takes one prompt per request; send them one by one", param="prompt"
        )
    if wants_logprobs and not (isinstance(found, EngineCapabilities) and found.logprobs):
        param = "logprobs" if logprobs not in (None, False) else "top_logprobs"
        return ClientError(
            f"logprobs are not available from the {backend} engine; leave {param} unset", param=param
        )
    return None
