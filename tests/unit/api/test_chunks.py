"""The engine's reply typed at the seam: the stream's fast path answers as the typed parse does,
and an engine answer that does not follow the protocol is a 502 (or an error event) naming the field."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tests.fakes.harness import settings_for
from tests.fakes.scripted_engine import ServerThread

from sparkfold.api import create_app
from sparkfold.api.chunks import ChunkModel, ChunkReader, fast_chunk
from sparkfold.api.tools import Toolbox
from sparkfold.protocol import ChatCompletionChunk, ChunkChoice, Completion, CompletionChoice, Delta
from sparkfold.sse import TextEvents

GOOD_CHUNK = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "fake"}
GOOD_REPLY = {"id": "c", "object": "chat.completion", "created": 1, "model": "fake"}
USAGE = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
TOOLBOX = Toolbox([{"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}}])
TRICKY = ["", "tok", '"', "\\", "\n", "\x00", "\x7f", "\u2028", "é", "😀", '","x":"', "}]}"]
texts = st.text(max_size=6) | st.sampled_from(TRICKY)
any_texts = texts | st.just("\ud800")  # a lone surrogate: JSON can escape it, UTF-8 cannot hold it


def ours(field: str, text: str, *, ident: str = "chatcmpl-1", created: int = 7, model: str = "m") -> bytes:
    """One token's payload exactly as our engine server writes it (TextEvents)."""
    if field == "text":
        choice = CompletionChoice(text=TextEvents.MARKER)
        chunk: Any = Completion(id=ident, model=model, created=created, choices=[choice])
    else:
        delta = Delta(**{field: TextEvents.MARKER})
        chunk = ChatCompletionChunk(
            id=ident, model=model, created=created, choices=[ChunkChoice(delta=delta)]
        )
    event = TextEvents(chunk)(text)
    return event.removeprefix(b"data: ").removesuffix(b"\n\n")


@st.composite
def chunk_dicts(draw: st.DrawFn) -> dict[str, Any]:
    value = st.none() | any_texts | st.integers(-2, 2) | st.booleans()
    delta = st.dictionaries(
        st.sampled_from(["content", "reasoning_content", "role", "tool_calls", "refusal"]), value, max_size=3
    )
    call = st.fixed_dictionaries(
        {"index": st.integers(0, 2) | texts},
        optional={
            "id": texts,
            "function": st.fixed_dictionaries({}, optional={"name": texts, "arguments": texts}),
        },
    )
    delta = delta | st.fixed_dictionaries({"tool_calls": st.lists(call, max_size=2)})
    choice = st.fixed_dictionaries(
        {},
        optional={
            "index": st.integers(0, 2),
            "delta": delta,
            "text": value,
            "finish_reason": st.none() | st.sampled_from(["stop", "tool_calls", "length", "eos"]),
        },
    )
    head = {
        "id": st.just("chatcmpl-1") | texts,
        "object": st.sampled_from(["chat.completion.chunk", "text_completion", "x"]),
        "created": st.integers(0, 10) | st.just(10**16) | texts,
        "model": st.just("m") | texts,
    }
    optional = {"usage": st.none() | st.fixed_dictionaries({"prompt_tokens": st.integers(0, 3) | texts})}
    chunk = draw(st.fixed_dictionaries({}, optional={**head, **optional}))
    chunk["choices"] = draw(st.lists(choice, max_size=2) | value)
    return draw(st.permutations(list(chunk.items())).map(dict) | st.just(chunk))


def encoded(chunk: dict[str, Any], compact: bool, ascii_only: bool) -> bytes:
    separators = (",", ":") if compact else (", ", ": ")
    return json.dumps(chunk, separators=separators, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


@st.composite
def mutated(draw: st.DrawFn, payload: bytes) -> bytes:
    ends = st.integers(0, min(6, len(payload))) | st.integers(max(0, len(payload) - 6), len(payload))
    at = draw(st.integers(0, len(payload)) | ends)  # the edges too: a chunk's head and its closing
    byte = draw(
        st.sampled_from([b'"', b"\\", b"0", b"{", b"}", b",", b":", b" ", b"x", b"\x80", b"\xff", b"\n"])
    )
    how = draw(st.sampled_from(["insert", "replace", "delete"]))
    if how == "insert":
        return payload[:at] + byte + payload[at:]
    if how == "replace":
        return payload[:at] + byte + payload[at + 1 :]
    return payload[:at] + payload[at + 1 :]


fast_shaped = st.builds(
    ours,
    st.sampled_from(["content", "reasoning_content", "text"]),
    texts,
    ident=st.just("chatcmpl-1") | texts,
    created=st.integers(0, 10**15),
    model=st.just("m") | texts,
)
generated = st.builds(encoded, chunk_dicts(), st.booleans(), st.booleans())
payloads = (fast_shaped | generated).flatmap(lambda p: st.just(p) | mutated(p))


@st.composite
def one_head(draw: st.DrawFn) -> list[bytes]:
    """A stream's tokens under one head (the reader then matches only their text), some mutated."""
    head = {"ident": draw(st.just("chatcmpl-1") | texts), "created": draw(st.integers(0, 9)), "model": "m"}
    fields = st.sampled_from(["content", "reasoning_content", "text"])
    tokens = draw(st.lists(st.tuples(fields, texts), min_size=2, max_size=6))
    stream = [ours(field, text, **head) for field, text in tokens]
    return [draw(st.just(p) | mutated(p)) for p in stream]


streams = st.lists(payloads, min_size=1, max_size=4) | one_head()


def normal(events: list[bytes | dict[str, Any]]) -> list[Any]:
    return [json.loads(event) if isinstance(event, bytes) else event for event in events]


def both(payloads: list[bytes], model: ChunkModel) -> Iterator[tuple[Any, Any]]:
    """Each payload read by a reader with the fast path and by one without, side by side."""
    seen = {True: 0, False: 0}
    readers = {}
    for fast in (True, False):
        readers[fast] = ChunkReader(
            TOOLBOX, model=model, fast=fast, on_text=lambda f=fast: seen.__setitem__(f, 1)
        )
    for payload in payloads:
        answers = [normal(readers[fast].read(payload)) for fast in (True, False)]
        yield tuple(answers)
        states = [(r.head, r.usage, r.errored) for r in readers.values()]
        yield states[0], states[1]
        yield seen[True], seen[False]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(streams, st.sampled_from([ChatCompletionChunk, Completion]))
@example(
    [
        ours("content", "01"),
        b'{"id":"a","object":"chat.completion.chunk","created":01,"model":"m",'
        b'"choices":[{"index":0,"delta":{"content":"x"}}]}',
    ],
    ChatCompletionChunk,
)
@example(
    [encoded({**GOOD_CHUNK, "choices": [{"index": 0, "delta": {"content": "\ud800"}}]}, True, True)],
    ChatCompletionChunk,
)
@example([ours("text", "x")], ChatCompletionChunk)
def test_the_fast_path_answers_as_the_typed_parse(stream: list[bytes], model: ChunkModel) -> None:
    for fast, typed in both(stream, model):
        assert fast == typed


@pytest.mark.parametrize("field", ["content", "reasoning_content", "text"])
@pytest.mark.parametrize("text", TRICKY)
def test_the_fast_path_takes_our_engine_servers_token_chunks(field: str, text: str) -> None:
    model: ChunkModel = Completion if field == "text" else ChatCompletionChunk
    payload = ours(field, text)
    taken = fast_chunk(payload, model)
    assert taken is not None, payload
    event, has_text, _ = taken
    assert has_text is (text != "")
    data = json.loads(event) if isinstance(event, bytes) else event
    if field == "reasoning_content":
        assert data["choices"][0]["delta"] == {"reasoning_content": text, "reasoning": text}
    else:
        assert event == payload  # passed on as its own bytes, never re-encoded


# --- through the gateway: a scripted engine that answers with whatever bytes it is given -----------


class RawEngine:
    """An engine server that answers every generating request with the bytes it was given."""

    def __init__(self) -> None:
        self.body = b"{}"
        self.stream = b""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        request = b""
        while True:
            message = await receive()
            request += message.get("body", b"")
            if not message.get("more_body"):
                break
        streamed = request and json.loads(request).get("stream")
        body = self.stream if streamed else self.body
        kind = b"text/event-stream" if streamed else b"application/json"
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", kind)]})
        await send({"type": "http.response.body", "body": body})


@pytest.fixture(scope="module")
def raw() -> Iterator[tuple[RawEngine, str]]:
    engine = RawEngine()
    with ServerThread(engine) as upstream, ServerThread(create_app(settings_for(upstream.port))) as gateway:
        yield engine, gateway.url


def reply(choice: dict[str, Any], usage: Any = USAGE) -> bytes:
    return json.dumps({**GOOD_REPLY, "choices": [choice], "usage": usage}).encode()


MALFORMED_REPLIES = [
    (reply({"index": 0, "message": {"role": "assistant", "content": 5}}), "choices.0.message.content"),
    (reply({"index": 0, "message": {"content": "hi"}}, usage={"prompt_tokens": "x"}), "usage.prompt_tokens"),
    (reply({"index": 0, "message": {"content": "hi", "tool_calls": [{"id": "a"}]}}), "tool_calls.0.function"),
    (reply({"index": 0}), "choices.0.message"),
    (reply({"index": 0, "message": {"content": "hi"}, "finish_reason": "eos"}), "choices.0.finish_reason"),
    (json.dumps({**GOOD_REPLY, "choices": [{"message": {"content": "hi"}}]}).encode(), "usage"),
    (b"[1, 2]", "Input should be an object"),
    (b"not json", "the body is not JSON"),
]


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/messages", "/v1/responses"])
@pytest.mark.parametrize(("body", "field"), MALFORMED_REPLIES)
def test_a_malformed_engine_reply_is_a_502_naming_the_field(
    raw: tuple[RawEngine, str], route: str, body: bytes, field: str
) -> None:
    engine, url = raw
    engine.body = body
    request: dict[str, Any] = {
        "model": "fake",
        "messages": [{"role": "user", "content": "x"}],
        "max_tokens": 5,
    }
    if route == "/v1/responses":
        request = {"model": "fake", "input": "x"}
    answer = httpx.post(url + route, json=request, timeout=30)
    assert answer.status_code == 502, answer.text
    message = json.dumps(answer.json())
    assert "does not follow the engine protocol" in message and field in message


def sse(*chunks: dict[str, Any]) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


@pytest.mark.parametrize(
    ("choice", "field"),
    [
        ({"index": 0, "delta": {"content": 5}}, "choices.0.delta.content"),
        ({"index": 0, "delta": {"tool_calls": [{"function": {"name": "get"}}]}}, "tool_calls.0.index"),
        ({"index": 0, "text": "hi"}, "choices.0.delta"),
    ],
)
def test_a_malformed_engine_chunk_is_an_error_event_naming_the_field(
    raw: tuple[RawEngine, str], choice: dict[str, Any], field: str
) -> None:
    engine, url = raw
    role = {**GOOD_CHUNK, "choices": [{"index": 0, "delta": {"role": "assistant"}}]}
    engine.stream = sse(role, {**GOOD_CHUNK, "choices": [choice]})
    request = {"model": "fake", "messages": [{"role": "user", "content": "x"}], "stream": True}
    with httpx.stream("POST", url + "/v1/chat/completions", json=request, timeout=30) as answer:
        body = answer.read().decode()
    events = [line[6:] for line in body.split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert (
        error["type"] == "upstream_error"
        and "a malformed chunk" in error["message"]
        and field in error["message"]
    )
