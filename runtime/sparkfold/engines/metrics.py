"""The engine server's counters: ``/health`` totals and Prometheus ``/metrics``.

Metric names follow TensorFold (``tensorfold:`` prefix) so the gateway can pass any engine's
metrics through unchanged. Each server owns its registry (no process-global state).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["EngineCounters"]

_LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


@dataclass
class EngineCounters:
    """Live totals (for ``/health``) mirrored into a Prometheus registry (for ``/metrics``)."""

    requests_running: int = 0
    requests_total: int = 0
    prompt_tokens_total: int = 0
    completion_tokens_total: int = 0
    prefill_seconds_total: float = 0.0
    decode_seconds_total: float = 0.0
    cached_tokens_total: int = 0
    drafted_total: int = 0
    accepted_total: int = 0
    registry: CollectorRegistry = field(default_factory=CollectorRegistry, repr=False)

    def __post_init__(self) -> None:
        r = self.registry
        self._running = Gauge("tensorfold:requests_running", "requests being generated", registry=r)
        self._waiting = Gauge("tensorfold:requests_waiting", "requests waiting for the engine", registry=r)
        self._requests = Counter("tensorfold:requests", "requests finished", ["finish_reason"], registry=r)
        self._prompt = Counter("tensorfold:prompt_tokens", "prompt tokens processed", registry=r)
        self._generated = Counter("tensorfold:generation_tokens", "tokens generated", registry=r)
        self._latency = Histogram(
            "tensorfold:request_latency_seconds",
            "request start to last token",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self._ttft = Histogram(
            "tensorfold:time_to_first_token_seconds",
            "request start to first token",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self._prefill = Histogram(
            "tensorfold:request_prefill_seconds",
            "prompt processing time",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self._cached = Counter("tensorfold:prompt_tokens_cached", "prompt tokens reused", registry=r)
        self._drafted = Counter(
            "tensorfold:spec_decode_num_draft_tokens", "draft tokens proposed", registry=r
        )
        self._accepted = Counter(
            "tensorfold:spec_decode_num_accepted_tokens", "draft tokens accepted", registry=r
        )
        self._decode = Histogram(
            "tensorfold:request_decode_seconds", "first to last token", buckets=_LATENCY_BUCKETS, registry=r
        )

    def started(self, prompt_tokens: int) -> None:
        self.requests_running += 1
        self.prompt_tokens_total += prompt_tokens
        self._running.inc()
        self._prompt.inc(prompt_tokens)

    def token(self) -> None:
        self.completion_tokens_total += 1
        self._generated.inc()

    def finished(self, finish_reason: str, prefill_s: float, decode_s: float) -> None:
        self.requests_running -= 1
        self.requests_total += 1
        self.prefill_seconds_total += prefill_s
        self.decode_seconds_total += decode_s
        self._running.dec()
        self._requests.labels(finish_reason).inc()
        self._ttft.observe(prefill_s)
        self._prefill.observe(prefill_s)
        self._decode.observe(decode_s)
        self._latency.observe(prefill_s + decode_s)

    def reported(self, cached: int, drafted: int, accepted: int) -> None:
        """An engine's report of one finished request: reused prompt tokens, drafts."""
        self.cached_tokens_total += cached
        self.drafted_total += drafted
        self.accepted_total += accepted
        self._cached.inc(cached)
        self._drafted.inc(drafted)
        self._accepted.inc(accepted)

    def totals(self) -> dict[str, int | float]:
        """The live totals by name, as ``/health`` reports them (seconds to the microsecond)."""
        values = {spec.name: vars(self)[spec.name] for spec in fields(self) if spec.name != "registry"}
        return {name: round(v, 6) if isinstance(v, float) else v for name, v in values.items()}

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
