"""No lane is ever lost (issue 12), against the scripted engine: every path frees its lane.

Each test waits for events or counters with a bound (``wait_for``, ``read_until``), never for
a length of time.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
from collections.abc import Callable

import httpx
from tests.fakes.harness import Running, until
from tests.fakes.raw_client import RawClient
from tests.fakes.scripted_engine import Script, ScriptedEngine

USER = [{"role": "user", "content": "x"}]
STREAM = {"model": "fake", "messages": USER, "stream": True}
COUNT = {"model": "fake", "messages": USER}
WEATHER = {
    "type": "function",
    "function": {
        "name": "weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def port_of(gateway: Running) -> int:
    return int(gateway.url.rsplit(":", 1)[1])


def test_a_capacity_refusal_goes_back_to_the_head_of_the_queue(
    start_gateway: Callable[..., Running], fake: ScriptedEngine
) -> None:
    gateway = start_gateway(parallel=1)
    fake.queue(Script(status=503, code="capacity"), Script(status=429))
    for stream in (False, True):
        fake.queue(Script(status=503, code="capacity"))
        reply = gateway.http.post("/v1/chat/completions", json={**STREAM, "stream": stream})
        assert reply.status_code == 200, reply.text
        assert b"error" not in reply.content
    chats = [r for r in fake.requests if r["path"] == "/v1/chat/completions"]
    assert len(chats) == 6  # four refusals (503 capacity, or the engine's own queue full), each asked again


def test_an_abandoned_non_streamed_request_frees_its_lane(
    start_gateway: Callable[..., Running], fake: ScriptedEngine
) -> None:
    gateway = start_gateway(parallel=1, max_queued=0)
    fake.queue(Script(stall_after=0))  # the engine never answers this one
    leaver = RawClient(port_of(gateway), "/v1/chat/completions", {"model": "fake", "messages": USER})
    fake.wait_for(lambda: fake.active == 1)
    leaver.close()
    fake.wait_for(lambda: fake.cancelled == 1, timeout=2)  # the engine saw the client leave
    until(lambda: gateway.health()["lanes"]["busy"] == 0, timeout=2)
    assert (
        gateway.http.post("/v1/chat/completions", json={"model": "fake", "messages": USER}).status_code == 200
    )


def test_a_reader_that_stops_reading_frees_its_lane(
    start_gateway: Callable[..., Running], fake: ScriptedEngine
) -> None:
    gateway = start_gateway(parallel=1, max_queued=0, send_timeout_s=0.5)
    fake.queue(Script(content=["x" * 8192] * 3000))  # 24 MiB: more than every buffer on the way holds
    reader = RawClient(port_of(gateway), "/v1/chat/completions", STREAM, receive_buffer=4096)
    uvicorn_log, records = logging.getLogger("uvicorn.error"), Records()
    uvicorn_log.addHandler(records)
    try:
        assert reader.status() == 200  # then it reads nothing more
        until(lambda: gateway.health()["lanes"]["busy"] == 0, timeout=20)
        fake.wait_for(lambda: fake.active == 0)  # its engine stream was closed too
        assert (
            gateway.http.post("/v1/chat/completions", json={"model": "fake", "messages": USER}).status_code
            == 200
        )
        until(lambda: any("stopped reading" in r.getMessage() for r in records.seen), timeout=20)
    finally:
        reader.close()
        uvicorn_log.removeHandler(records)
    # main: uvicorn's ERROR "ASGI callable returned without completing response" at each cut
    assert [(r.levelname, r.getMessage()) for r in records.seen if r.levelno >= logging.INFO] == [
        ("INFO", "the stream of a client that stopped reading was cut (handled)")
    ]


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.seen: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.seen.append(record)


def test_a_client_of_a_heartbeating_engine_gets_keepalives(
    start_gateway: Callable[..., Running], fake: ScriptedEngine
) -> None:
    """The engine is never silent (it sends heartbeats while it reads a long prompt), but the client
    has received nothing: the gateway's keepalive goes to the client all the same."""
    gateway = start_gateway(keepalive_s=0.3)
    fake.queue(Script(content=["a"], stall_after=0, heartbeat_s=0.05))
    client = RawClient(port_of(gateway), "/v1/chat/completions", STREAM)
    try:
        client.read_until(b'"role":"assistant"')
        client.read_until(b": keepalive", timeout=5)
    finally:
        client.close()
    fake.wait_for(lambda: fake.cancelled == 1)


def test_a_tool_call_streams_its_name_and_arguments_before_it_ends(
    gateway: Running, fake: ScriptedEngine
) -> None:
    arguments = json.dumps({"city": "Paris" * 20})
    for path, body, marker in (
        ("/v1/chat/completions", {**STREAM, "tools": [WEATHER]}, b'"arguments":"Paris'),
        (
            "/v1/messages",
            {
                "model": "fake",
                "max_tokens": 64,
                "stream": True,
                "messages": USER,
                "tools": [{"name": "weather", "input_schema": WEATHER["function"]["parameters"]}],  # type: ignore[index]
            },
            b'"type":"input_json_delta","partial_json":"Paris',
        ),
    ):
        # the engine writes the call in 8 pieces, then goes on generating (never finishes)
        fake.queue(
            Script(content=[], tool_calls=[("weather", arguments)], tool_pieces=8, stall_before_finish=True)
        )
        client = RawClient(port_of(gateway), path, body)
        try:
            received = client.read_until(marker, timeout=5)
            assert b'"weather"' in received
        finally:
            client.close()
    fake.wait_for(lambda: fake.cancelled == 2)


def test_background_requests_wait_behind_normal_ones(
    start_gateway: Callable[..., Running], fake: ScriptedEngine
) -> None:
    gateway = start_gateway(parallel=1, max_queued=4)
    fake.queue(Script(content=["a", "b"], stall_after=1))
    running = RawClient(port_of(gateway), "/v1/chat/completions", STREAM)
    fake.wait_for(lambda: fake.active == 1)
    late = {**STREAM, "messages": [{"role": "user", "content": "background"}], "priority": "background"}
    waiting = [RawClient(port_of(gateway), "/v1/chat/completions", late)]
    until(lambda: gateway.health()["queue"]["length"] == 1)
    normal = {**STREAM, "messages": [{"role": "user", "content": "normal"}]}
    waiting.append(RawClient(port_of(gateway), "/v1/chat/completions", normal))
    until(lambda: gateway.health()["queue"]["length"] == 2)
    running.close()
    for client in waiting:
        assert client.status() == 200
        client.read_until(b"[DONE]")
        client.close()
    order = [r["messages"][0]["content"] for r in fake.requests if r["path"] == "/v1/chat/completions"]
    assert order == ["x", "normal", "background"]


def test_an_unknown_priority_is_refused_naming_the_field(gateway: Running) -> None:
    reply = gateway.http.post("/v1/chat/completions", json={**STREAM, "priority": "urgent"})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "priority"


def test_every_picture_part_type_counts_against_the_gateways_limits(
    start_gateway: Callable[..., Running], fake: ScriptedEngine
) -> None:
    gateway = start_gateway(max_images=1)
    picture = "data:image/png;base64,iVBORw0KGgo="
    content = [{"type": "image", "image": picture}, {"type": "input_image", "image_url": picture}]
    reply = gateway.http.post(
        "/v1/chat/completions", json={"model": "fake", "messages": [{"role": "user", "content": content}]}
    )
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == "messages[0].content[1].input_image"
    assert not [r for r in fake.requests if r["path"] == "/v1/chat/completions"]


def test_the_first_token_may_take_longer_than_the_silence_between_tokens(
    start_gateway: Callable[..., Running], fake: ScriptedEngine
) -> None:
    gateway = start_gateway(upstream_timeout_s=0.3, first_token_timeout_s=30)
    fake.queue(Script(content=["slow prefill"], pace_s=1.0))  # the first token after 1 s of silence
    with httpx.stream("POST", gateway.url + "/v1/chat/completions", json=STREAM, timeout=30) as reply:
        text = b"".join(reply.iter_bytes())
    assert b"slow prefill" in text and b'"error"' not in text
    fake.queue(Script(content=["a", "b"], stall_after=1))  # silent after the first token: that fails
    with httpx.stream("POST", gateway.url + "/v1/chat/completions", json=STREAM, timeout=30) as reply:
        text = b"".join(reply.iter_bytes())
    assert b'"error"' in text and b"stopped sending" in text


def test_tokenize_is_held_to_the_same_picture_limits(
    start_gateway: Callable[..., Running], fake: ScriptedEngine
) -> None:
    gateway = start_gateway(max_images=1)
    picture = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
    reply = gateway.http.post(
        "/tokenize", json={"messages": [{"role": "user", "content": [picture, picture]}]}
    )
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == "messages[0].content[1].image_url"
    assert not [r for r in fake.requests if r["path"] == "/tokenize"]


def test_a_flood_of_tokenize_calls_is_bounded_and_leaves_generation_alone(
    start_gateway: Callable[..., Running], fake: ScriptedEngine
) -> None:
    from sparkfold.api.lanes import TOKENIZER_LANES, TOKENIZER_QUEUE

    gateway = start_gateway(parallel=1)
    flood = TOKENIZER_LANES + TOKENIZER_QUEUE + 2
    fake.tokenize_open.clear()
    try:
        with concurrent.futures.ThreadPoolExecutor(flood) as pool:
            calls = [pool.submit(httpx.post, gateway.url + "/tokenize", json={"prompt": "a b"}, timeout=60)]
            calls += [
                pool.submit(httpx.post, gateway.url + "/v1/messages/count_tokens", json=COUNT, timeout=60)
                for _ in range(flood - 1)
            ]
            fake.wait_for(lambda: fake.tokenizing == TOKENIZER_LANES)
            until(lambda: sum(call.done() for call in calls) == flood - TOKENIZER_LANES - TOKENIZER_QUEUE)
            refused = [call.result() for call in calls if call.done()]
            # generation is not starved: a chat request runs while every tokenizer lane is held
            reply = gateway.http.post("/v1/chat/completions", json={**STREAM, "stream": False})
            assert reply.status_code == 200, reply.text
            fake.tokenize_open.set()
            answered = [call.result() for call in calls]
    finally:
        fake.tokenize_open.set()
    assert fake.most_tokenizing == TOKENIZER_LANES
    assert [r.status_code for r in refused] == [429] * 2
    assert "the tokenizer routes' own lanes" in refused[0].json()["error"]["message"]
    assert sorted(r.status_code for r in answered) == [200] * (flood - 2) + [429] * 2
