"""The engine's capabilities (its /v1/models card) are asked once per engine start, not per request."""

from __future__ import annotations

from collections.abc import Callable

from tests.fakes.harness import Running
from tests.fakes.scripted_engine import ScriptedEngine


def ask_for_two_choices(gateway: Running, times: int) -> list[int]:
    body = {"model": "fake", "messages": [{"role": "user", "content": "x"}], "n": 2}
    return [gateway.http.post("/v1/chat/completions", json=body).status_code for _ in range(times)]


def test_one_card_fetch_per_engine_start(start_gateway: Callable[..., Running], fake: ScriptedEngine) -> None:
    start = {"pid": 4242}
    gateway = start_gateway(engine_start=lambda: start["pid"])
    assert ask_for_two_choices(gateway, 3) == [400, 400, 400]  # the card declares no n: refused
    assert fake.models_calls == 1
    # The engine restarts (a new serving pid) as an engine that can give n: asked again, once.
    fake.capabilities = {"backend": "scripted", "n": True, "logprobs": True}
    start["pid"] = 4343
    gateway.http.post("/v1/completions", json={"model": "fake", "prompt": ["a", "b"]})
    assert fake.models_calls == 2
    assert ask_for_two_choices(gateway, 2) == [200, 200]
    assert fake.models_calls == 2


def test_without_a_known_start_the_card_is_asked_each_time(
    start_gateway: Callable[..., Running], fake: ScriptedEngine
) -> None:
    """No serving rank recorded (None), or no source at all: a restart cannot be told, so no cache."""
    for gateway in (start_gateway(engine_start=lambda: None), start_gateway()):
        before = fake.models_calls
        assert ask_for_two_choices(gateway, 2) == [400, 400]
        assert fake.models_calls == before + 2


def test_requests_that_need_nothing_extra_ask_nothing(
    start_gateway: Callable[..., Running], fake: ScriptedEngine
) -> None:
    gateway = start_gateway(engine_start=lambda: 1)
    body = {"model": "fake", "messages": [{"role": "user", "content": "x"}]}
    assert gateway.http.post("/v1/chat/completions", json=body).status_code == 200
    assert fake.models_calls == 0
