"""Prometheus metrics of the gateway (``sparkfold_*``), served with the engine's own lines appended.

Each application owns a registry, so several gateways (tests) never share counters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sparkfold.api.lanes import Lanes

__all__ = ["ALIASES", "ROUTES", "EngineLoad", "MemoryKills", "Metrics", "StartFigures", "route_label"]


class StartFigures(Protocol):
    """How this node's engine rank started (``sparkfold.node.marker.Serving``): the seconds from its
    process start to READY, ``first`` or ``restart``, and its phases (``load_s``, ``warmup_s``,
    ``first_token_s``)."""

    load_s: float | None
    start: str | None
    phases: dict[str, float] | None


# The serving rank's start, or None where no rank is marked serving (the command reads
# sparkfold.node.marker's marker).
EngineLoad = Callable[[], StartFigures | None]
# How often the node's memory guard has killed the engine rank (the command reads the guard's
# record, sparkfold.node.guard).
MemoryKills = Callable[[], int]

# Known routes are labels as they are; anything else is "other" (unbounded paths, unbounded series).
ROUTES = frozenset(
    {
        "/v1/models",
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/tokenize",
        "/detokenize",
        "/health",
        "/metrics",
    }
)

_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


# TensorFold's alternative paths count under the canonical route.
ALIASES = {
    "/models": "/v1/models",
    "/v1/health": "/health",
    "/v1/metrics": "/metrics",
    "/v1/tokenize": "/tokenize",
    "/v1/detokenize": "/detokenize",
    "/messages": "/v1/messages",
    "/messages/count_tokens": "/v1/messages/count_tokens",
}


def route_label(path: str) -> str:
    path = ALIASES.get(path, path)
    if path in ROUTES:
        return path
    if path.startswith("/v1/responses/"):
        return "/v1/responses/{id}"
    return "other"


class _EngineLoadCollector(Collector):
    """``sparkfold_engine_load_seconds``, present only while a rank is marked serving."""

    def __init__(self, source: EngineLoad) -> None:
        self.source = source

    def describe(self) -> list[Metric]:
        return []  # asked at every scrape: the series comes and goes with the rank

    def collect(self) -> Iterator[Metric]:
        found = self.source()
        if found is None or found.load_s is None:
            return
        family = GaugeMetricFamily(
            "sparkfold_engine_load_seconds",
            "Seconds the serving engine rank's start took: phase ready = process start to ready; load, "
            "warmup, first_token its phases; start = first, or restart (compile caches found)",
            labels=["phase", "start"],
        )
        start = found.start or "unknown"
        family.add_metric(["ready", start], found.load_s)
        for name, seconds in (found.phases or {}).items():
            family.add_metric([name.removesuffix("_s"), start], seconds)
        yield family


class _MemoryKillsCollector(Collector):
    """``sparkfold_engine_memory_kills_total``, read from the guard's record at every scrape."""

    def __init__(self, source: MemoryKills) -> None:
        self.source = source

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "sparkfold_engine_memory_kills",
            "Engine ranks on this node killed by the memory guard (the engine outgrew its memory budget)",
            value=self.source(),
        )


class Metrics:
    def __init__(
        self, lanes: Lanes, engine_load: EngineLoad | None = None, memory_kills: MemoryKills | None = None
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._children: dict[tuple[str, int], tuple[Any, Any]] = {}
        r = self.registry
        self.requests = Counter(
            "sparkfold_requests", "Requests answered, by route and status", ["route", "status"], registry=r
        )
        self.latency = Histogram(
            "sparkfold_request_duration_seconds",
            "Time from request to the end of its response",
            ["route"],
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "sparkfold_time_to_first_token_seconds",
            "Time from request to the first generated token sent",
            ["route"],
            buckets=_TTFT_BUCKETS,
            registry=r,
        )
        self.tokens = Counter(
            "sparkfold_tokens", "Tokens reported by the engine, by kind", ["kind"], registry=r
        )
        self.rejected = Counter(
            "sparkfold_rejected", "Requests refused with 429: lanes and queue full", registry=r
        )
        self.dropped = Counter(
            "sparkfold_queue_dropped", "Queued requests whose client left before a lane freed", registry=r
        )
        self.cancelled = Counter(
            "sparkfold_streams_cancelled", "Streams cancelled upstream because the client left", registry=r
        )
        self.upstream_errors = Counter(
            "sparkfold_upstream_errors", "Engine failures seen by the gateway", registry=r
        )
        Gauge("sparkfold_lanes", "Lanes to the engine (api.parallel)", registry=r).set_function(
            lambda: lanes.parallel
        )
        Gauge("sparkfold_lanes_busy", "Lanes in use", registry=r).set_function(lambda: lanes.state.busy)
        Gauge("sparkfold_queue_length", "Requests waiting for a lane", registry=r).set_function(
            lambda: lanes.state.queued
        )
        Gauge("sparkfold_queue_max", "Queue capacity (api.max_queued)", registry=r).set_function(
            lambda: lanes.max_queued
        )
        if engine_load is not None:
            r.register(_EngineLoadCollector(engine_load))
        if memory_kills is not None:
            r.register(_MemoryKillsCollector(memory_kills))

    def count_request(self, route: str, status: int, seconds: float) -> None:
        """One answered request (status 0: the client left first) and how long it took."""
        children = self._children.get((route, status))
        if children is None:  # labels() costs a lock and a lookup: once per route and status
            children = self._children[route, status] = (
                self.requests.labels(route, str(status)),
                self.latency.labels(route),
            )
        children[0].inc()
        children[1].observe(seconds)

    def count_usage(self, usage: object) -> None:
        """Add an engine ``usage`` object (dict) to the token counters; ignore anything malformed."""
        if not isinstance(usage, dict):
            return
        for kind, key in (("prompt", "prompt_tokens"), ("completion", "completion_tokens")):
            value = usage.get(key)
            if isinstance(value, int) and value > 0:
                self.tokens.labels(kind).inc(value)

    def render(self, engine_text: str | None) -> bytes:
        ours = generate_latest(self.registry)
        if engine_text is None:
            return ours + b"# engine metrics unavailable (engine unreachable)\n"
        return ours + b"# engine metrics follow\n" + engine_text.encode()
