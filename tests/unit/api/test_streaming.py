"""Keepalives, stalled upstreams and client disconnects on streamed routes."""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
from tests.fakes.harness import Running
from tests.fakes.scripted_engine import Script, ScriptedEngine

CHAT = {"model": "fake", "messages": [{"role": "user", "content": "x"}], "stream": True}


def wait_health(gateway: Running, predicate: Callable[[dict], bool], timeout: float = 10.0) -> dict:  # type: ignore[type-arg]
    """Poll /health until ``predicate`` holds (bounded)."""
    import time

    deadline = time.monotonic() + timeout
    while True:
        health = gateway.health()
        if predicate(health):
            return health
        assert time.monotonic() < deadline, f"health never matched: {health}"
        time.sleep(0.02)


def test_silent_upstream_gets_keepalive_comments(
    start_gateway: Callable[..., Running], fake: ScriptedEngine
) -> None:
    gateway = start_gateway(keepalive_s=0.05)
    fake.queue(Script(content=["a", "b"], stall_after=1))
    with gateway.http.stream("POST", "/v1/chat/completions", json=CHAT) as response:
        lines = response.iter_lines()
        seen: list[str] = []
        for line in lines:
            seen.append(line)
            if seen.count(": keepalive") >= 2:
                break
    assert any(line.startswith("data:") and '"a"' in line for line in seen)
    assert seen.count(": keepalive") == 2
    fake.wait_for(lambda: fake.cancelled == 1)


def test_stalled_upstream_past_timeout_ends_with_error_then_done(
    start_gateway: Callable[..., Running], fake: ScriptedEngine
) -> None:
    gateway = start_gateway(keepalive_s=0.05, upstream_timeout_s=0.3)
    fake.queue(Script(content=["a", "b"], stall_after=1))
    with gateway.http.stream("POST", "/v1/chat/completions", json=CHAT) as response:
        events = [line for line in response.iter_lines() if line.startswith("data:")]
    error = json.loads(events[-2].removeprefix("data:"))["error"]
    assert error["type"] == "upstream_timeout"
    assert events[-1] == "data: [DONE]"


def test_client_leaving_mid_stream_cancels_upstream_and_frees_the_lane(
    gateway: Running, fake: ScriptedEngine
) -> None:
    fake.queue(Script(content=["a", "b", "c"], stall_after=1))
    with gateway.http.stream("POST", "/v1/chat/completions", json=CHAT) as response:
        lines = response.iter_lines()  # held: dropping the iterator would close the connection
        for line in lines:
            if '"a"' in line:
                break
        assert gateway.health()["lanes"]["busy"] == 1
        assert fake.cancelled == 0
    fake.wait_for(lambda: fake.cancelled == 1)
    wait_health(gateway, lambda h: h["lanes"]["busy"] == 0)
    metrics = gateway.http.get("/metrics").text
    assert "sparkfold_streams_cancelled_total 1.0" in metrics


def test_anthropic_stream_pings_on_silence(
    start_gateway: Callable[..., Running], fake: ScriptedEngine
) -> None:
    gateway = start_gateway(keepalive_s=0.05)
    fake.queue(Script(content=["a", "b"], stall_after=1))
    body = {"model": "fake", "max_tokens": 10, "stream": True, "messages": [{"role": "user", "content": "x"}]}
    with (
        httpx.Client(base_url=gateway.url, timeout=10) as http,
        http.stream("POST", "/v1/messages", json=body) as r,
    ):
        for line in r.iter_lines():
            if line == "event: ping":
                break
    fake.wait_for(lambda: fake.cancelled == 1)


def test_slow_upstream_interleaves_keepalives_and_loses_nothing(
    start_gateway: Callable[..., Running], fake: ScriptedEngine
) -> None:
    gateway = start_gateway(keepalive_s=0.02)
    fake.queue(Script(content=["s", "l", "o", "w"], pace_s=0.1))
    with gateway.http.stream("POST", "/v1/chat/completions", json=CHAT) as response:
        lines = [line for line in response.iter_lines() if line]
    content = "".join(
        json.loads(line.removeprefix("data:"))["choices"][0]["delta"].get("content", "")
        for line in lines
        if line.startswith("data:") and line != "data: [DONE]" and '"choices"' in line
    )
    assert content == "slow"
    first_token = next(i for i, line in enumerate(lines) if '"s"' in line)
    assert ": keepalive" in lines[first_token:]  # silences between tokens were filled
    assert lines[-1] == "data: [DONE]"
