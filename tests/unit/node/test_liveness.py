"""``sparkfold.node.liveness`` against a scripted engine server (httpx.MockTransport) and a clock."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from sparkfold.node.liveness import Liveness


class Engine:
    """Rank 0 as its /health and /v1/completions answer; ``wedged`` = probes get no answer."""

    def __init__(self) -> None:
        self.health: dict[str, Any] = {"ok": True, "requests_running": 0, "requests_total": 0}
        self.health_status = 200
        self.wedged = False
        self.probe_status = 200
        self.probes = 0

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(self.health_status, json=self.health)
        assert request.url.path == "/v1/completions"
        self.probes += 1
        if self.wedged:
            raise httpx.ReadTimeout("timed out", request=request)
        return httpx.Response(self.probe_status, json={"choices": [{"text": "H"}]})


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def engine() -> Engine:
    return Engine()


@pytest.fixture
def clock() -> Clock:
    return Clock()


def liveness(engine: Engine, clock: Clock) -> Liveness:
    client = httpx.Client(transport=httpx.MockTransport(engine))
    return Liveness(
        "http://127.0.0.1:18888", stall_s=60, probe_every_s=300, probe_timeout_s=5, client=client, clock=clock
    )


def test_an_idle_rank_is_fed_between_probes_and_probed_when_due(engine: Engine, clock: Clock) -> None:
    live = liveness(engine, clock)
    assert live.check().ok and engine.probes == 0
    clock.now += 300
    assert live.check().ok and engine.probes == 1


def test_an_idle_rank_whose_probe_hangs_is_not_fed_until_it_answers(engine: Engine, clock: Clock) -> None:
    live = liveness(engine, clock)
    engine.wedged = True  # /health still says ok: process alive, no work done
    clock.now += 300
    verdict = live.check()
    assert not verdict.ok and "1-token probe got no answer" in verdict.reason
    clock.now += 1
    assert not live.check().ok and engine.probes == 2  # retried at every tick while failing
    engine.wedged = False
    assert live.check().ok


def test_a_busy_rank_is_fed_while_its_counters_move_and_not_once_stalled(
    engine: Engine, clock: Clock
) -> None:
    live = liveness(engine, clock)
    engine.health |= {"requests_running": 2, "completion_tokens_total": 10}
    assert live.check().ok
    clock.now += 50
    engine.health["completion_tokens_total"] = 20
    assert live.check().ok
    clock.now += 59
    assert live.check().ok  # no token for 59 s: within stall_s
    clock.now += 2
    verdict = live.check()
    assert not verdict.ok and "2 request(s) running and no token counted for 61 s" in verdict.reason
    assert engine.probes == 0  # a busy engine is never probed on top of its work


@pytest.mark.parametrize(("status", "body"), [(503, {"ok": False}), (200, {"ok": False}), (200, [])])
def test_an_unhealthy_answer_is_no_progress(engine: Engine, clock: Clock, status: int, body: Any) -> None:
    live = liveness(engine, clock)
    engine.health_status, engine.health = status, body
    verdict = live.check()
    assert not verdict.ok and "/health answered" in verdict.reason


def test_no_answer_at_all_is_no_progress(clock: Clock) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    live = Liveness(
        "http://127.0.0.1:1",
        stall_s=60,
        probe_every_s=300,
        probe_timeout_s=5,
        client=httpx.Client(transport=httpx.MockTransport(refuse)),
        clock=clock,
    )
    verdict = live.check()
    assert not verdict.ok and "/health does not answer: connection refused" in verdict.reason


def test_a_full_engine_answering_429_counts_as_an_answer(engine: Engine, clock: Clock) -> None:
    live = liveness(engine, clock)
    engine.probe_status = 429
    clock.now += 300
    assert live.check().ok


def test_health_without_counters_leaves_it_to_the_probe(engine: Engine, clock: Clock) -> None:
    live = liveness(engine, clock)
    engine.health = {"status": "ok"}  # TensorFold 0.6.5+ with its own API keys
    assert live.check().ok
    engine.wedged = True
    clock.now += 300
    assert not live.check().ok
