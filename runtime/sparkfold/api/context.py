"""What a serving function knows about the HTTP call it serves, without seeing HTTP."""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sparkfold.api.errors import ApiError

__all__ = ["Admit", "CallContext"]

# Take a lane for the call (see sparkfold.api.middleware.admission): None once it has one, the
# error to answer with when there is none. Serving calls it after its checks, before the engine;
# the argument is the queue priority (0 normal, 1 background: behind every normal request).
Admit = Callable[[int], Awaitable[ApiError | None]]


async def _no_admission(priority: int = 0) -> None:
    return None


@dataclass(frozen=True)
class CallContext:
    route: str
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    started: float = field(default_factory=time.perf_counter)
    admit: Admit = _no_admission
    tenant: str = ""
    """The digest of the API key that made the call (``""`` without keys): stored objects' owner."""
    headers: dict[str, str] = field(default_factory=dict)
    """Response headers the serving adds (the route sends them with the answer, an error's too)."""

    @classmethod
    def of_scope(cls, scope: Mapping[str, Any], route: str) -> CallContext:
        state = scope.get("state") or {}
        return cls(
            route=route,
            request_id=state.get("request_id") or uuid.uuid4().hex,
            started=state.get("started") or time.perf_counter(),
            admit=state.get("admit") or _no_admission,
            tenant=state.get("tenant") or "",
        )
