"""/health and /metrics: gateway state joined with the engine's, peer rank included."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tests.fakes.harness import Running, settings_for
from tests.fakes.scripted_engine import ScriptedEngine, ServerThread

from sparkfold.api import create_app
from sparkfold.config import parse
from sparkfold.protocol import PeerState


def test_metrics_have_sparkfold_series_and_the_engine_lines(gateway: Running) -> None:
    body = {"model": "fake", "messages": [{"role": "user", "content": "x"}]}
    gateway.http.post("/v1/chat/completions", json=body)
    gateway.http.post("/v1/chat/completions", json={**body, "stream": True})
    text = gateway.http.get("/metrics").text
    for name in (
        'sparkfold_requests_total{route="/v1/chat/completions",status="200"} 2.0',
        "sparkfold_request_duration_seconds_bucket",
        'sparkfold_time_to_first_token_seconds_count{route="/v1/chat/completions"} 1.0',
        'sparkfold_tokens_total{kind="completion"} 8.0',
        "sparkfold_lanes 4.0",
        "sparkfold_lanes_busy 0.0",
        "sparkfold_queue_length 0.0",
        "sparkfold_rejected_total 0.0",
        "tensorfold:requests_running 0",
    ):
        assert name in text, name


def test_responses_carry_a_request_id(gateway: Running) -> None:
    assert len(gateway.http.get("/health").headers["x-request-id"]) == 32
    assert gateway.http.get("/health", headers={"x-request-id": "abc-1"}).headers["x-request-id"] == "abc-1"


@pytest.fixture
def paired() -> Iterator[tuple[ScriptedEngine, str]]:
    fake = ScriptedEngine(peer={"rank": 1, "state": "ok", "last_seen_s": 0.5})
    with ServerThread(fake) as engine, ServerThread(create_app(settings_for(engine.port))) as gateway:
        yield fake, gateway.url


def test_health_reports_the_peer_rank_and_lanes(paired: tuple[ScriptedEngine, str]) -> None:
    fake, url = paired
    health = httpx.get(url + "/health")
    assert health.status_code == 200
    body = health.json()
    assert body["ok"] and body["peer"] == {"rank": 1, "state": "ok", "last_seen_s": 0.5}
    assert body["lanes"] == {"total": 4, "busy": 0, "free": 4, "engine_total": 64, "engine_busy": 0}
    assert body["queue"] == {"length": 0, "max": 16}
    fake.streams = 2  # an engine with fewer lanes than api.parallel: /health shows the real ones
    assert httpx.get(url + "/health").json()["lanes"] == {
        "total": 2,
        "busy": 0,
        "free": 2,
        "engine_total": 2,
        "engine_busy": 0,
    }
    fake.peer = {"rank": 1, "state": "lost", "last_seen_s": 130}
    lost = httpx.get(url + "/health")
    assert lost.status_code == 503 and lost.json()["peer"]["state"] == "lost"


def test_an_engine_without_lane_count_or_peer_gets_the_configured_lanes_and_the_supervisors_peer() -> None:
    """The recipe's TensorFold: ``streams`` is what its streams do, and no ``peer`` block."""
    fake = ScriptedEngine()
    fake.streams = {"decoding": 1, "filling": 0, "paused": 0}  # type: ignore[assignment]
    peer = [PeerState(rank=1, state="ok", last_seen_s=0.4)]
    with ServerThread(fake) as engine:
        settings = settings_for(engine.port)
        settings = settings.model_copy(update={"engine": settings.engine.model_copy(update={"parallel": 6})})
        with ServerThread(create_app(settings, peer_state=lambda: peer[0])) as gateway:
            body = httpx.get(gateway.url + "/health").json()
            assert body["lanes"] == {"total": 4, "busy": 0, "free": 4, "engine_total": 6, "engine_busy": 0}
            assert body["peer"] == {"rank": 1, "state": "ok", "last_seen_s": 0.4}
            peer[0] = PeerState(rank=1, state="lost", last_seen_s=130)
            lost = httpx.get(gateway.url + "/health")
            assert lost.status_code == 503 and lost.json()["peer"]["state"] == "lost"
            fake.peer = {"rank": 1, "state": "ok", "last_seen_s": 0.1}  # the engine's own block wins
            assert httpx.get(gateway.url + "/health").json()["peer"]["last_seen_s"] == 0.1


def test_tensorfold_aliases_answer_like_their_routes(gateway: Running) -> None:
    assert gateway.http.get("/v1/health").json()["lanes"]["total"] == 4
    assert gateway.http.get("/models").json()["data"][0]["id"] == "fake"
    assert gateway.http.post("/v1/tokenize", json={"prompt": "a b c"}).json()["count"] == 3
    body = {"model": "fake", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
    assert gateway.http.post("/messages", json=body).json()["type"] == "message"
    assert gateway.http.post("/messages", json={}).json()["type"] == "error"  # Anthropic's error shape
    assert 'route="/v1/messages"' in gateway.http.get("/v1/metrics").text


def test_metrics_carry_the_engine_load_only_while_a_rank_serves() -> None:
    from sparkfold.api.lanes import Lanes
    from sparkfold.api.metrics import Metrics
    from sparkfold.node.marker import Serving

    load: list[Serving | None] = [None]
    metrics = Metrics(Lanes(1, 1), engine_load=lambda: load[0])
    assert b"sparkfold_engine_load_seconds" not in metrics.render("")  # no rank marked serving
    phases = {"load_s": 30.5, "warmup_s": 9.25, "first_token_s": 0.5}
    load[0] = Serving("f", 1, 0, load_s=437.25, start="restart", phases=phases)
    text = metrics.render("").decode()
    assert 'sparkfold_engine_load_seconds{phase="ready",start="restart"} 437.25' in text
    assert 'sparkfold_engine_load_seconds{phase="warmup",start="restart"} 9.25' in text
    assert 'sparkfold_engine_load_seconds{phase="first_token",start="restart"} 0.5' in text
    load[0] = Serving("f", 1, 0, load_s=400.0)  # a marker written before phases were recorded
    assert 'sparkfold_engine_load_seconds{phase="ready",start="unknown"} 400.0' in metrics.render("").decode()
    assert b"sparkfold_engine_load_seconds" not in Metrics(Lanes(1, 1)).render("")  # no source (tests)


def test_metrics_count_the_memory_guards_kills_from_its_record(tmp_path: Path) -> None:
    from sparkfold.api.lanes import Lanes
    from sparkfold.api.metrics import Metrics
    from sparkfold.commands.api_cmd import _memory_kills

    settings = parse({"engine": {"model": "/m"}, "paths": {"state_dir": str(tmp_path)}})
    reader = _memory_kills(settings)
    assert reader is not None
    metrics = Metrics(Lanes(1, 1), memory_kills=reader)
    assert b"sparkfold_engine_memory_kills_total 0.0" in metrics.render("")  # no record yet
    record = tmp_path / "guard/memory-kills"
    record.parent.mkdir()
    record.write_text("1765000000 4242 python3\n1765000100 4343 tensorfold serve\n")
    assert b"sparkfold_engine_memory_kills_total 2.0" in metrics.render("")
