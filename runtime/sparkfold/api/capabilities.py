"""What the engine behind the gateway can do beyond TensorFold's contract, asked when a request needs it.

Our engine servers describe themselves on their ``/v1/models`` card (``capabilities``: backend,
``logprobs``, ``n``); TensorFold's card has no such block, so the gateway takes it for "none of
it". A request for several choices, a list of prompts or log-probabilities is refused before it
takes a lane when the engine cannot serve it, with a 400 that names the engine.

The card is asked once per engine start, not per request: :class:`Capabilities` keeps the answer
under the key ``engine_start()`` returns (the command passes the pid of the rank that this node's
engine unit marked serving, :func:`sparkfold.node.marker.serving`), and asks again when the key
changes, i.e. the engine restarted. Without a key (no source, or no serving rank recorded: a
gateway in front of an engine it does not share a node with) it asks every time, as it cannot
tell a restart.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any

from sparkfold.api.errors import ApiError, ClientError, InvalidRequest
from sparkfold.api.upstream import Engine
from sparkfold.protocol import EngineCapabilities

__all__ = ["Capabilities", "EngineStart"]

EngineStart = Callable[[], Hashable | None]
"""What identifies the engine's current start (None: unknown)."""


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


class Capabilities:
    """The engine's capabilities, asked once per engine start (``engine_start``'s key)."""

    def __init__(self, engine: Engine, engine_start: EngineStart | None = None) -> None:
        self.engine = engine
        self.engine_start = engine_start
        self._known: tuple[Hashable, EngineCapabilities | str] | None = None

    async def current(self) -> EngineCapabilities | str:
        """What the engine declares (its name when nothing), from the card of its current start."""
        key = self.engine_start() if self.engine_start is not None else None
        if key is not None and self._known is not None and self._known[0] == key:
            return self._known[1]
        found = await _capabilities(self.engine)
        # the key read before asking: an engine that restarted meanwhile is asked again next time
        self._known = None if key is None else (key, found)
        return found

    async def refuse_unsupported(
        self, *, n: int | None, logprobs: Any, top_logprobs: Any, prompts: int = 1
    ) -> ApiError | None:
        """A 400 naming the engine when it cannot give what the request asks for, else ``None``."""
        wants_logprobs = logprobs not in (None, False) or top_logprobs not in (None, 0)
        wants_choices = (n or 1) != 1 or prompts != 1
        if not (wants_logprobs or wants_choices):
            return None
        try:
            found = await self.current()
        except ApiError as error:
            return error
        return _refusal(
            found, n=n, logprobs=logprobs, wants_logprobs=wants_logprobs, wants_choices=wants_choices
        )


def _refusal(
    found: EngineCapabilities | str,
    *,
    n: int | None,
    logprobs: Any,
    wants_logprobs: bool,
    wants_choices: bool,
) -> ApiError | None:
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
