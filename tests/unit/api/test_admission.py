"""Admission with concurrent clients: exactly `parallel` run, `max_queued` wait, the rest get 429."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest
from tests.fakes.harness import Running
from tests.fakes.harness import until as poll
from tests.fakes.raw_client import RawClient
from tests.fakes.scripted_engine import Script, ScriptedEngine

CHAT = {"model": "fake", "messages": [{"role": "user", "content": "x"}], "stream": True}


def chat_requests(fake: ScriptedEngine) -> int:
    return sum(1 for r in fake.requests if r["path"] == "/v1/chat/completions")


@pytest.fixture
def busy_gateway(start_gateway: Callable[..., Running], fake: ScriptedEngine) -> Running:
    # every stream sends one token, then stalls until its client leaves
    fake.default = Script(content=["a", "b"], stall_after=1)
    return start_gateway(parallel=2, max_queued=2, keepalive_s=60)


def test_parallel_run_queue_waits_rest_refused_and_leavers_free_places(
    busy_gateway: Running, fake: ScriptedEngine
) -> None:
    port = int(busy_gateway.url.rsplit(":", 1)[1])
    running = [RawClient(port, "/v1/chat/completions", CHAT) for _ in range(2)]
    fake.wait_for(lambda: fake.active == 2)
    queued = [RawClient(port, "/v1/chat/completions", CHAT) for _ in range(2)]
    poll(lambda: busy_gateway.health()["queue"]["length"] == 2)

    refused = httpx.post(busy_gateway.url + "/v1/chat/completions", json=CHAT)
    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "5"
    assert "lanes are busy" in refused.json()["error"]["message"]
    assert chat_requests(fake) == 2  # neither the queued nor the refused reached the engine

    # a queued client that leaves is dropped at once and gives up its place
    queued[0].close()
    poll(lambda: busy_gateway.health()["queue"]["length"] == 1)
    assert chat_requests(fake) == 2

    # a running client that leaves is cancelled upstream; its lane goes to the next in the queue
    running[0].close()
    fake.wait_for(lambda: fake.cancelled == 1)
    fake.wait_for(lambda: chat_requests(fake) == 3 and fake.active == 2)
    assert queued[1].status() == 200
    queued[1].read_until(b'"content":"a"')
    health = busy_gateway.health()
    assert (health["lanes"]["busy"], health["queue"]["length"]) == (2, 0)

    for client in (running[1], queued[1]):
        client.close()
    fake.wait_for(lambda: fake.active == 0)
    poll(lambda: busy_gateway.health()["lanes"]["busy"] == 0)
    metrics = busy_gateway.http.get("/metrics").text
    assert "sparkfold_rejected_total 1.0" in metrics
    assert "sparkfold_queue_dropped_total 1.0" in metrics


def test_anthropic_route_refuses_in_its_own_shape(busy_gateway: Running, fake: ScriptedEngine) -> None:
    port = int(busy_gateway.url.rsplit(":", 1)[1])
    clients = [RawClient(port, "/v1/chat/completions", CHAT) for _ in range(2)]
    fake.wait_for(lambda: fake.active == 2)
    clients += [RawClient(port, "/v1/chat/completions", CHAT) for _ in range(2)]
    poll(lambda: busy_gateway.health()["queue"]["length"] == 2)
    body = {"model": "fake", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}]}
    refused = httpx.post(busy_gateway.url + "/v1/messages", json=body)
    assert refused.status_code == 429
    assert refused.json() == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": refused.json()["error"]["message"]},
    }
    for client in clients:
        client.close()
    fake.wait_for(lambda: fake.active == 0)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"n": 2}, "n"),
        ({"logprobs": True}, "logprobs"),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                        ],
                    }
                ]
            },
            "messages[0].content[1].image_url",
        ),
    ],
)
def test_limits_are_checked_before_admission(
    start_gateway: Callable[..., Running], fake: ScriptedEngine, fields: dict[str, Any], param: str
) -> None:
    fake.default = Script(content=["a", "b"], stall_after=1)
    gateway = start_gateway(parallel=1, max_queued=1, max_images=1, keepalive_s=60)
    port = int(gateway.url.rsplit(":", 1)[1])
    clients = [RawClient(port, "/v1/chat/completions", CHAT)]
    fake.wait_for(lambda: fake.active == 1)
    clients.append(RawClient(port, "/v1/chat/completions", CHAT))
    poll(lambda: gateway.health()["queue"]["length"] == 1)
    assert httpx.post(gateway.url + "/v1/chat/completions", json=CHAT).status_code == 429  # saturated

    oversized = httpx.post(gateway.url + "/v1/chat/completions", json={**CHAT, **fields})
    assert oversized.status_code == 400, oversized.text
    assert oversized.json()["error"]["param"] == param
    health = gateway.health()
    assert (health["lanes"]["busy"], health["queue"]["length"]) == (1, 1)  # it never took a place
    for client in clients:
        client.close()
    fake.wait_for(lambda: fake.active == 0)
