"""What a serving function knows about the HTTP call it serves, without seeing HTTP."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

__all__ = ["CallContext"]


@dataclass(frozen=True)
class CallContext:
    route: str
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    started: float = field(default_factory=time.perf_counter)

    @classmethod
    def of_scope(cls, scope: dict[str, Any], route: str) -> CallContext:
        state = scope.get("state") or {}
        return cls(
            route=route,
            request_id=state.get("request_id") or uuid.uuid4().hex,
            started=state.get("started") or time.perf_counter(),
        )
