"""The engine server's HTTP contract, against the in-process fake engine."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator

import pytest
from fastapi.testclient import TestClient
from tests.fakes.fake_engine import FakeGenerator

from sparkfold.engines.generator import EngineFailure, EngineGone, SamplingParams
from sparkfold.engines.server import create_app
from sparkfold.engines.service import EngineService
from sparkfold.glm.errors import GrammarDeadEnd
from sparkfold.protocol import (
    ChatCompletion,
    ChatCompletionChunk,
    Delta,
    EngineHealth,
    PeerState,
    ToolCallDelta,
)

CHAT = {"messages": [{"role": "user", "content": "Capital of France?"}], "temperature": 0}


def _client(fake: FakeGenerator, **options: object) -> TestClient:
    service = EngineService(fake, served_name="fake-model", max_tokens=64, **options)  # type: ignore[arg-type]
    return TestClient(create_app(service))


def _events(text: str) -> list[str]:
    return [line[6:] for line in text.splitlines() if line.startswith("data: ")]


def test_models_lists_the_served_name(fake: FakeGenerator) -> None:
    data = _client(fake).get("/v1/models").json()
    assert [m["id"] for m in data["data"]] == ["fake-model"]


def test_chat_completion_uses_the_template_and_counts_tokens(fake: FakeGenerator) -> None:
    reply = _client(fake).post("/v1/chat/completions", json=CHAT)
    assert reply.status_code == 200
    answer = ChatCompletion.model_validate(reply.json())
    assert answer.choices[0].message.content == "Paris is the capital."
    assert answer.choices[0].finish_reason == "stop"
    prompt = "<user>Capital of France?</user><assistant>"
    assert fake.seen[0][0] == list(prompt.encode())
    assert answer.usage.prompt_tokens == len(prompt)
    assert answer.usage.completion_tokens == len("Paris is the capital.") + 1  # EOS counts
    assert answer.tensorfold is not None and "decode_s" in answer.tensorfold


def test_stream_format(fake: FakeGenerator) -> None:
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    with _client(fake).stream("POST", "/v1/chat/completions", json=body) as reply:
        assert reply.status_code == 200
        assert reply.headers["content-type"].startswith("text/event-stream")
        events = _events(reply.read().decode())
    assert events[-1] == "[DONE]"
    chunks = [ChatCompletionChunk.model_validate_json(e) for e in events[:-1]]
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Paris is the capital."
    final, usage_only = chunks[-2], chunks[-1]
    assert final.choices[0].finish_reason == "stop"
    assert final.usage is not None and final.tensorfold is not None
    assert usage_only.choices == [] and usage_only.usage == final.usage


def test_max_tokens_ends_with_length(fake: FakeGenerator) -> None:
    answer = _client(fake).post("/v1/chat/completions", json={**CHAT, "max_tokens": 5}).json()
    assert answer["choices"][0]["message"]["content"] == "Paris"
    assert answer["choices"][0]["finish_reason"] == "length"


def test_stop_strings_cut_the_reply_and_cancel_the_engine(fake: FakeGenerator) -> None:
    answer = _client(fake).post("/v1/chat/completions", json={**CHAT, "stop": [" the"]}).json()
    assert answer["choices"][0]["message"]["content"] == "Paris is"
    assert answer["choices"][0]["finish_reason"] == "stop"
    assert fake.cancelled[0].is_set()


def test_sampling_fields_reach_the_engine(fake: FakeGenerator) -> None:
    body = {**CHAT, "temperature": 0.7, "top_p": 0.9, "top_k": 5, "min_p": 0.1, "seed": 3, "max_tokens": 9}
    _client(fake).post("/v1/chat/completions", json=body)
    params = fake.seen[0][1]
    assert (params.temperature, params.top_p, params.top_k, params.min_p, params.seed, params.max_tokens) == (
        0.7,
        0.9,
        5,
        0.1,
        3,
        9,
    )


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({**CHAT, "max_tokens": -1}, "max_tokens"),
        ({**CHAT, "max_tokens": 0}, "max_tokens"),
        ({**CHAT, "temperature": "hot"}, "temperature"),
        ({"messages": "hello"}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages.0.role"),
        ({**CHAT, "n": 17}, "n"),
        ({**CHAT, "stream": "yes please"}, "stream"),
    ],
)
def test_bad_fields_are_400_naming_the_field(
    fake: FakeGenerator, body: dict[str, object], param: str
) -> None:
    client = _client(fake)
    reply = client.post("/v1/chat/completions", json=body)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["param"] == param and param.split(".")[0] in error["message"]
    assert client.post("/v1/chat/completions", json=CHAT).status_code == 200  # still serving


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b"\xff\xfe"])
def test_malformed_bodies_are_400(fake: FakeGenerator, raw: bytes) -> None:
    reply = _client(fake).post("/v1/chat/completions", content=raw)
    assert reply.status_code == 400 and reply.json()["error"]["code"] == "invalid_json"


def test_prompt_longer_than_the_window_is_context_length_exceeded(fake: FakeGenerator) -> None:
    body = {"messages": [{"role": "user", "content": "x" * 300}]}
    reply = _client(fake).post("/v1/chat/completions", json=body)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert "This server's maximum context length is 256 tokens" in error["message"]


def test_prompt_plus_max_tokens_over_the_window_is_refused(fake: FakeGenerator) -> None:
    reply = _client(fake).post("/v1/completions", json={"prompt": "hello", "max_tokens": 252})
    assert reply.status_code == 400 and reply.json()["error"]["code"] == "context_length_exceeded"


def test_unknown_path_is_404_in_the_openai_shape(fake: FakeGenerator) -> None:
    reply = _client(fake).get("/v1/nothing")
    assert reply.status_code == 404 and "error" in reply.json()


def test_at_capacity_is_503(fake: FakeGenerator) -> None:
    fake.parallel = 0
    reply = _client(fake).post("/v1/chat/completions", json=CHAT)
    assert reply.status_code == 503 and reply.json()["error"]["code"] == "capacity"


def test_error_after_the_stream_opened_is_an_error_event_then_done(fake: FakeGenerator) -> None:
    fake.fail_after = 3
    with _client(fake).stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as reply:
        events = _events(reply.read().decode())
    assert events[-1] == "[DONE]"
    assert "the fake engine broke" in json.loads(events[-2])["error"]["message"]


def test_error_before_streaming_is_500_not_a_crash(fake: FakeGenerator) -> None:
    fake.fail_after = 0
    client = _client(fake)
    assert client.post("/v1/chat/completions", json=CHAT).status_code == 500
    fake.fail_after = None
    assert client.post("/v1/chat/completions", json=CHAT).status_code == 200


def test_completions_take_text_or_token_ids(fake: FakeGenerator) -> None:
    client = _client(fake)
    for prompt in ("abc", [97, 98, 99]):
        reply = client.post(
            "/v1/completions", json={"prompt": prompt, "max_tokens": 5, "return_token_ids": True}
        )
        choice = reply.json()["choices"][0]
        assert choice["text"] == "Paris" and choice["token_ids"] == list(b"Paris")
        assert fake.seen[-1][0] == [97, 98, 99]


def test_completion_stream(fake: FakeGenerator) -> None:
    with _client(fake).stream("POST", "/v1/completions", json={"prompt": "a", "stream": True}) as reply:
        events = _events(reply.read().decode())
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == "Paris is the capital."
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop" and chunks[-1]["usage"]


def test_tokenize_and_detokenize_use_vllm_fields(fake: FakeGenerator) -> None:
    client = _client(fake)
    data = client.post("/tokenize", json={"prompt": "hi"}).json()
    assert data == {"count": 2, "max_model_len": 256, "tokens": [104, 105], "token_strs": ["h", "i"]}
    chat = client.post("/tokenize", json={"messages": CHAT["messages"]}).json()
    assert chat["count"] == len("<user>Capital of France?</user><assistant>")
    assert client.post("/detokenize", json={"tokens": [104, 105]}).json() == {"prompt": "hi"}
    assert client.post("/detokenize", json={"tokens": "hi"}).json()["error"]["param"] == "tokens"


def test_health_counts_and_carries_the_peer_block(fake: FakeGenerator) -> None:
    client = _client(fake, peer_state=lambda: PeerState(rank=1, state="ok", last_seen_s=0.5))
    client.post("/v1/chat/completions", json=CHAT)
    health = EngineHealth.model_validate(client.get("/health").json())
    assert health.ok and health.requests_total == 1 and health.completion_tokens_total == 22
    assert health.peer is not None and health.peer.state == "ok"
    assert health.context_length == 256


def test_health_is_503_when_the_peer_is_lost(fake: FakeGenerator) -> None:
    client = _client(fake, peer_state=lambda: PeerState(rank=1, state="lost"))
    reply = client.get("/health")
    assert reply.status_code == 503 and reply.json()["ok"] is False


def test_metrics_are_prometheus_text(fake: FakeGenerator) -> None:
    client = _client(fake)
    client.post("/v1/chat/completions", json=CHAT)
    text = client.get("/metrics").text
    assert 'tensorfold:requests_total{finish_reason="stop"} 1.0' in text
    assert "tensorfold:generation_tokens_total 22.0" in text


class _Refusing:
    def render(self, request: object) -> str:
        error = ValueError("tool 'x' has no parameters schema")
        error.param = "tools.0"  # type: ignore[attr-defined]
        raise error


class _ThinkingParser:
    """Text before '|' is reasoning; a '!' becomes a tool call (a stand-in for the GLM parser)."""

    def __init__(self) -> None:
        self.tool_calls_made = False
        self.ended = False
        self.thinking = True
        self.finished_with: str | None = None

    def feed(self, text: str) -> list[Delta]:
        deltas = []
        for char in text:
            if char == "|":
                self.thinking = False
            elif char == "!":
                self.tool_calls_made = True
                call = ToolCallDelta(
                    index=0, id="call-1", type="function", function={"name": "shout", "arguments": "{}"}
                )
                deltas.append(Delta(tool_calls=[call]))
            elif self.thinking:
                deltas.append(Delta(reasoning_content=char))
            else:
                deltas.append(Delta(content=char))
        return deltas

    def finish(self, finish_reason: str | None = None) -> list[Delta]:
        self.finished_with = finish_reason
        return []


def test_a_renderer_refusal_is_400_naming_its_field(fake: FakeGenerator) -> None:
    reply = _client(fake, renderer=_Refusing()).post("/v1/chat/completions", json=CHAT)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "tools.0"


def test_the_parser_seam_splits_reasoning_content_and_tool_calls(fake: FakeGenerator) -> None:
    fake.reply = b"hmm|Paris!"
    parsers: list[_ThinkingParser] = []

    def factory(request: object) -> _ThinkingParser:
        parsers.append(_ThinkingParser())
        return parsers[-1]

    client = _client(fake, parser_factory=factory)
    message = client.post("/v1/chat/completions", json=CHAT).json()["choices"][0]
    assert message["message"]["reasoning_content"] == "hmm" and message["message"]["content"] == "Paris"
    assert message["message"]["tool_calls"][0]["function"] == {"name": "shout", "arguments": "{}"}
    assert message["finish_reason"] == "tool_calls" and parsers[0].finished_with == "stop"
    with client.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as reply:
        chunks = [json.loads(e) for e in _events(reply.read().decode())[:-1]]
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "hmm"
    assert any("tool_calls" in d for d in deltas)
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_stop_token_ids_end_the_reply(fake: FakeGenerator) -> None:
    client = _client(fake, stop_token_ids=frozenset({ord(" ")}))
    answer = client.post("/v1/chat/completions", json=CHAT).json()["choices"][0]
    assert answer["message"]["content"] == "Paris" and answer["finish_reason"] == "stop"
    assert fake.seen[0][1].stop_token_ids == frozenset({32})


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", {"prompt": [1, 2, 999]}, "prompt"),
        ("/v1/completions", {"prompt": [-1]}, "prompt"),
        ("/detokenize", {"tokens": [5000]}, "tokens"),
    ],
)
def test_token_ids_outside_the_vocabulary_are_400(
    fake: FakeGenerator, path: str, body: dict[str, object], param: str
) -> None:
    reply = _client(fake).post(path, json=body)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == param
    assert "between 0 and 256" in reply.json()["error"]["message"]


def test_an_engine_error_is_counted_as_error(fake: FakeGenerator) -> None:
    fake.fail_after = 2
    client = _client(fake)
    client.post("/v1/chat/completions", json=CHAT)
    assert 'tensorfold:requests_total{finish_reason="error"} 1.0' in client.get("/metrics").text
    assert client.get("/health").json()["requests_running"] == 0


@pytest.mark.parametrize(
    ("failure", "status", "code"),
    [
        (EngineGone("the engine core (pid 7) exited with code -9"), 503, "engine_unavailable"),
        (EngineFailure("lost rank 1"), 500, "engine_error"),
        (
            GrammarDeadEnd("the grammar allows no token after 2 tokens", "guided_grammar"),
            400,
            "grammar_dead_end",
        ),
    ],
)
def test_a_gone_engine_is_503_a_failed_one_500_a_grammar_dead_end_400(
    fake: FakeGenerator, failure: BaseException, status: int, code: str
) -> None:
    fake.fail_after, fake.failure = 0, failure
    client = _client(fake)
    reply = client.post("/v1/chat/completions", json=CHAT)
    assert reply.status_code == status and reply.json()["error"]["code"] == code
    assert str(failure) in reply.json()["error"]["message"]
    with client.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as streamed:
        events = [line[6:] for line in streamed.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and json.loads(events[-2])["error"]["code"] == code


def test_a_stream_waiting_for_its_first_token_gets_heartbeats(fake: FakeGenerator) -> None:
    """A long prompt is being read: the engine says it is alive while no token comes."""
    fake.delay_s = 0.5  # before each token
    service = EngineService(fake, served_name="fake-model", max_tokens=64)  # type: ignore[arg-type]
    client = TestClient(create_app(service, heartbeat_s=0.05))
    body = {**CHAT, "stream": True, "max_tokens": 1}
    with client.stream("POST", "/v1/chat/completions", json=body) as reply:
        text = reply.read().decode()
    assert ": keepalive" in text.split('"content":"P"')[0]


def test_rendering_runs_off_the_event_loop(fake: FakeGenerator) -> None:
    """A prompt that takes long to render stalls nobody else: /health answers meanwhile."""
    import threading

    rendering, release = threading.Event(), threading.Event()

    class SlowRenderer:
        def render(self, request: object) -> str:
            rendering.set()
            release.wait(timeout=30)
            return "slow prompt"

    service = EngineService(fake, served_name="fake-model", max_tokens=8, renderer=SlowRenderer())  # type: ignore[arg-type]
    with TestClient(create_app(service)) as client:
        worker = threading.Thread(target=lambda: client.post("/v1/chat/completions", json=CHAT))
        worker.start()
        try:
            assert rendering.wait(timeout=10)
            answered: list[int] = []
            probe = threading.Thread(target=lambda: answered.append(client.get("/health").status_code))
            probe.start()
            probe.join(timeout=5)  # while the render goes on
            assert answered == [200]
        finally:
            release.set()
            worker.join(timeout=30)


def test_several_choices_keep_their_one_lane(fake: FakeGenerator) -> None:
    """n=3 streamed on a one-lane engine: a request waiting for the lane starts only after the third choice,
    never between two of them (it would take the lane the next choice needs)."""
    fake.parallel = 1
    started, gate = threading.Event(), threading.Event()
    service = EngineService(fake, served_name="fake-model", max_tokens=4)  # type: ignore[arg-type]
    original = fake.generate

    async def gated(
        prompt_ids: list[int], params: SamplingParams, cancel: threading.Event
    ) -> AsyncIterator[int]:
        if not started.is_set():  # the first choice waits until the other request is queued
            started.set()
            for _ in range(1000):
                if gate.is_set():
                    break
                await asyncio.sleep(0.01)
        async for token in original(prompt_ids, params, cancel):
            yield token

    fake.generate = gated  # type: ignore[method-assign]
    first = {
        "messages": [{"role": "user", "content": "first"}],
        "n": 3,
        "seed": 7,
        "max_tokens": 4,
        "stream": True,
    }
    second = {"messages": [{"role": "user", "content": "second"}], "max_tokens": 4}
    replies: dict[str, int] = {}

    def post(key: str, body: dict[str, object]) -> None:
        replies[key] = client.post("/v1/chat/completions", json=body).status_code

    with TestClient(create_app(service)) as client:
        a = threading.Thread(target=post, args=("a", first))
        a.start()
        assert started.wait(timeout=120)  # the first request may import xgrammar
        b = threading.Thread(target=post, args=("b", second))
        b.start()
        for _ in range(1000):  # bounded: until the second request waits for the lane
            if service.capacity.waiters:
                break
            time.sleep(0.01)
        queued = bool(service.capacity.waiters)
        gate.set()
        a.join(timeout=30)
        b.join(timeout=30)
    assert queued, "the second request never waited for the lane"
    assert replies == {"a": 200, "b": 200}
    order = [b"second" in bytes(i for i in ids if i < 256) for ids, _ in fake.seen]
    assert order == [False, False, False, True]
    assert [params.seed for _, params in fake.seen[:3]] == [7, 8, 9]


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [("TRACE", "/health", "GET"), ("TRACE", "/v1/chat/completions", "POST"), ("DELETE", "/v1/models", "GET")],
)
def test_a_method_a_path_does_not_answer_is_a_405_with_allow(
    fake: FakeGenerator, method: str, path: str, allow: str
) -> None:
    # main: 405 without Allow (the gateway's named the methods already)
    response = _client(fake).request(method, path)
    assert response.status_code == 405 and response.headers["allow"] == allow
    assert response.json()["error"]["message"].endswith(f"it answers {allow}")


def test_a_short_request_is_not_prepared_behind_a_long_prompt(fake: FakeGenerator) -> None:
    """A long prompt's rendering and tokenizing (seconds at 1M tokens) holds neither the engine
    thread nor the short requests that arrive meanwhile: they are prepared beside it."""
    import httpx

    from sparkfold.engines.prompt_workers import LONG_BODY_BYTES

    release, reading = threading.Event(), threading.Event()
    plain = fake.encode

    def encode(text: str, *, add_special_tokens: bool = False) -> list[int]:
        if len(text) > LONG_BODY_BYTES:  # the long prompt's tokenizing, held until released
            reading.set()
            release.wait(30)
        return plain(text, add_special_tokens=add_special_tokens)

    fake.encode = encode  # type: ignore[method-assign]
    app = create_app(EngineService(fake, served_name="fake-model", max_tokens=64))  # type: ignore[arg-type]
    long = {"messages": [{"role": "user", "content": "x" * (LONG_BODY_BYTES + 1)}], "max_tokens": 1}

    async def scenario() -> tuple[int, bool, int]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://engine") as client:
            first = asyncio.create_task(client.post("/v1/chat/completions", json=long))
            while not reading.is_set():
                await asyncio.sleep(0.01)
            short = await asyncio.wait_for(client.post("/v1/chat/completions", json=CHAT), 20)
            still_reading = not first.done()
            release.set()
            return short.status_code, still_reading, (await first).status_code

    try:
        short_status, still_reading, long_status = asyncio.run(scenario())
    finally:
        release.set()
    assert short_status == 200 and still_reading
    assert long_status == 400  # past the fake's window: refused once it was read
