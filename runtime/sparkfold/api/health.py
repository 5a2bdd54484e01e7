"""``GET /health`` and ``GET /metrics``: the gateway's state joined with the engine's.

Health is ``ok`` when the engine answers ``ok`` and its peer rank (the ``peer`` block of the
engine's ``/health``; absent on a single-rank engine) is not lost. Routes answer 503 otherwise,
with the same body, so a load balancer and a human read the same facts.

Without an accepted API key (where keys are in force) ``/health`` shows only ``ok``
(:class:`OpenHealth`), from a report at most :data:`OPEN_CACHE_S` old: a load balancer learns what
it needs, a stranger learns nothing about the engine, and a flood of probes costs the engine one
call per :data:`OPEN_CACHE_S`.

``lanes`` are the engine's real lanes: ``total`` is what the gateway may use of them (its
``api.parallel``, never more than the engine's ``streams``), ``busy`` the requests it admitted;
``engine_total`` and ``engine_busy`` are the engine's own counts. An engine whose ``streams`` is
not a count (the reference recipe's TensorFold reports what its streams do) gets the configured
``engine.parallel`` as ``engine_total``.

An engine whose ``/health`` has no ``peer`` block (TensorFold) gets the peer state its node's
supervisor knows, from ``peer_state`` (the command passes :func:`sparkfold.node.peer.recorded_peer`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, Field, ValidationError

from sparkfold import __commit_id__, __version__
from sparkfold.api.errors import ApiError
from sparkfold.api.lanes import Lanes
from sparkfold.api.metrics import Metrics
from sparkfold.api.upstream import Engine
from sparkfold.protocol import EngineHealth, PeerState

__all__ = ["OPEN_CACHE_S", "GatewayHealth", "HealthServing", "OpenHealth", "PeerSource"]

PROBE_TIMEOUT_S = 3.0
OPEN_CACHE_S = 1.0


class LaneReport(BaseModel):
    total: int = Field(description="lanes usable now: api.parallel, at most the engine's streams")
    busy: int = Field(description="requests the gateway admitted to the engine")
    free: int
    engine_total: int | None = Field(None, description="the engine's streams (its parallel); null if unknown")
    engine_busy: int | None = Field(None, description="requests the engine runs now; null if unknown")


class QueueReport(BaseModel):
    length: int
    max: int


class GatewayHealth(BaseModel):
    ok: bool = Field(description="gateway up, engine ok, peer rank not lost")
    gateway: dict[str, Any]
    engine: dict[str, Any] = Field(description="the engine's /health, or ok=false and the error")
    peer: PeerState | None = Field(None, description="the engine's peer rank; null on a single rank")
    lanes: LaneReport
    queue: QueueReport


class OpenHealth(BaseModel):
    """``/health`` for a caller without an accepted key."""

    ok: bool = Field(description="gateway up, engine ok, peer rank not lost")


PeerSource = Callable[[], PeerState | None]
"""Where the peer state comes from when the engine's ``/health`` has none."""


class HealthServing:
    def __init__(
        self,
        *,
        engine: Engine,
        lanes: Lanes,
        metrics: Metrics,
        engine_lanes: int | None = None,
        peer_state: PeerSource | None = None,
    ) -> None:
        self.engine = engine
        self.lanes = lanes
        self.metrics = metrics
        self.engine_lanes = engine_lanes
        """The configured ``engine.parallel``: ``engine_total`` when the engine counts no lanes."""
        self.peer_state = peer_state
        self._open: tuple[float, OpenHealth] | None = None
        self._refresh = asyncio.Lock()

    async def open_health(self) -> OpenHealth:
        """Only ``ok``, from a report at most :data:`OPEN_CACHE_S` old (one engine call per period)."""
        async with self._refresh:
            if self._open is None or time.monotonic() - self._open[0] >= OPEN_CACHE_S:
                report = await self.health()
                self._open = (time.monotonic(), OpenHealth(ok=report.ok))
            return self._open[1]

    async def health(self) -> GatewayHealth:
        state = self.lanes.state
        peer: PeerState | None = None
        known: EngineHealth | None = None
        try:
            raw = await self.engine.get_json("/health", timeout_s=PROBE_TIMEOUT_S)
            engine = EngineHealth.model_validate(raw)
            # no block (TensorFold): what the node's supervisor knows; "absent": a single rank, null
            reported = engine.peer if engine.peer is not None else self._supervised_peer()
            peer = reported if reported is not None and reported.state != "absent" else None
            engine_report: dict[str, Any] = {
                "url": self.engine.base_url,
                **engine.model_dump(exclude={"peer"}),
            }
            engine_ok = engine.ok
            known = engine
        except (ApiError, ValidationError) as exc:
            message = exc.message if isinstance(exc, ApiError) else "the engine's /health is malformed"
            engine_report = {"url": self.engine.base_url, "ok": False, "error": message}
            engine_ok = False
        peer_ok = peer is None or peer.state != "lost"
        return GatewayHealth(
            ok=engine_ok and peer_ok,
            gateway={"ok": True, "version": __version__, "commit": __commit_id__},
            engine=engine_report,
            peer=peer,
            lanes=_lanes(state.total, state.busy, known, self.engine_lanes),
            queue=QueueReport(length=state.queued, max=state.max_queued),
        )

    def _supervised_peer(self) -> PeerState | None:
        return None if self.peer_state is None else self.peer_state()

    async def metrics_text(self) -> bytes:
        try:
            engine_text: str | None = await self.engine.get_text("/metrics", timeout_s=PROBE_TIMEOUT_S)
        except ApiError:
            engine_text = None
        return self.metrics.render(engine_text)


def _lanes(total: int, busy: int, engine: EngineHealth | None, configured: int | None) -> LaneReport:
    if engine is None:
        return LaneReport(total=total, busy=busy, free=max(total - busy, 0))
    # a count of lanes; the recipe's engine reports what its streams do instead: the configured count
    capacity = engine.streams if isinstance(engine.streams, int) else configured
    usable = min(total, capacity) if capacity is not None else total
    return LaneReport(
        total=usable,
        busy=busy,
        free=max(usable - busy, 0),
        engine_total=capacity,
        engine_busy=engine.requests_running,
    )
