"""Two pairs behind the real router (SMG) and the fleet front, on loopback, through the official SDKs.

Which pair served a request is read from the pairs' own engines (``engine.requests``) and gateway
metrics, never from the router. The tests share one fleet and run in file order: the last ones
stop, drain and bring back pairs.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from fleet_procs import CLIENT_KEY, ROUTER_KEY, Fleet
from tests.fakes.scripted_engine import Script

pytestmark = pytest.mark.slow

SYSTEM = "You are a careful assistant. " + "Keep every answer short and exact. " * 90  # ~3,000 characters


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    pytest.importorskip("smg", reason="the router's wheel (pip install 'sparkfold[router]')")
    fleet = Fleet(tmp_path_factory.mktemp("fleet"))
    try:
        # one lane and no queue per pair, so a second request to a busy pair is a 429
        fleet.start(["a", "b"], gateway={"parallel": 1, "max_queued": 0}, router={})
        yield fleet
    finally:
        fleet.close()


def openai_client(fleet: Fleet, key: str = CLIENT_KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=fleet.url + "/v1", api_key=key, max_retries=0, timeout=30)


def anthropic_client(fleet: Fleet, key: str = CLIENT_KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=fleet.url, api_key=key, max_retries=0, timeout=30)


class Conversation:
    """A multi-turn conversation with a unique system prompt; every turn resends the whole history."""

    def __init__(self, dialect: str) -> None:
        self.marker = uuid.uuid4().hex
        self.dialect = dialect
        self.system = f"[{self.marker}] {SYSTEM}"
        self.turns: list[dict[str, str]] = []

    def turn(self, fleet: Fleet, text: str, *, stream: bool = True) -> str:
        self.turns.append({"role": "user", "content": text})
        answer = (self._openai if self.dialect == "openai" else self._anthropic)(fleet, stream)
        self.turns.append({"role": "assistant", "content": answer})
        return answer

    def _openai(self, fleet: Fleet, stream: bool) -> str:
        messages = [{"role": "system", "content": self.system}, *self.turns]
        client = openai_client(fleet)
        if not stream:
            reply = client.chat.completions.create(model="fake", messages=messages, max_tokens=16)  # type: ignore[arg-type]
            return reply.choices[0].message.content or ""
        chunks = client.chat.completions.create(model="fake", messages=messages, max_tokens=16, stream=True)  # type: ignore[arg-type]
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    def _anthropic(self, fleet: Fleet, stream: bool) -> str:
        client = anthropic_client(fleet)
        kwargs = {"model": "fake", "max_tokens": 16, "system": self.system, "messages": self.turns}
        if not stream:
            reply = client.messages.create(**kwargs)  # type: ignore[arg-type]
            return "".join(block.text for block in reply.content if block.type == "text")
        with client.messages.stream(**kwargs) as events:  # type: ignore[arg-type]
            return "".join(events.text_stream)


def start_side_by_side(fleet: Fleet, first: Conversation, second: Conversation) -> None:
    """The first turns of two new conversations, the second sent while the first is still running."""
    gate = threading.Event()
    for pair in fleet.pairs:
        pair.engine.queue(Script(content=[pair.name, " says", " hi"], gate=gate))
    running = threading.Thread(target=first.turn, args=(fleet, "question 0: what comes next?"))
    running.start()
    try:
        fleet.pairs[0].engine.wait_for(lambda: sum(p.engine.active for p in fleet.pairs) == 1)
        threading.Timer(0.5, gate.set).start()  # the second turn is routed while the first holds a pair
        second.turn(fleet, "question 0: what comes next?")
    finally:
        gate.set()
        running.join(timeout=30)


def test_conversations_stay_on_one_pair_while_new_ones_spread(fleet: Fleet) -> None:
    conversations = [Conversation("openai" if i % 2 == 0 else "anthropic") for i in range(6)]
    for first, second in zip(conversations[::2], conversations[1::2], strict=True):
        start_side_by_side(fleet, first, second)
    for turn in range(1, 3):
        for conversation in conversations:
            answer = conversation.turn(fleet, f"question {turn}: what comes next?")
            assert answer.endswith(" says hi"), answer
    homes = [fleet.served_by(c.marker) for c in conversations]
    assert all(len(home) == 1 for home in homes), homes
    for conversation, home in zip(conversations, homes, strict=True):
        (name,) = home
        assert fleet.pair(name).saw(conversation.marker) == 3  # every turn, on the pair that holds it
    assert set().union(*homes) == {"a", "b"}, f"new conversations all went to {homes[0]}"


def test_keys_are_required_at_the_router_and_the_pairs_take_only_the_routers(fleet: Fleet) -> None:
    body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    assert httpx.post(fleet.url + "/v1/chat/completions", json=body).status_code == 401
    with pytest.raises(openai.AuthenticationError):
        openai_client(fleet, key="sk-wrong").chat.completions.create(**body)  # type: ignore[call-overload]
    with pytest.raises(anthropic.AuthenticationError):
        anthropic_client(fleet, key="sk-wrong").messages.create(
            model="fake", max_tokens=4, messages=[{"role": "user", "content": "hi"}]
        )
    # the client's key opens the fleet, not a pair; the router's own key opens a pair
    pair = fleet.pairs[0]
    direct = httpx.post(pair.url + "/v1/chat/completions", json=body, headers={"x-api-key": CLIENT_KEY})
    assert direct.status_code == 401
    routed = httpx.post(pair.url + "/v1/chat/completions", json=body, headers={"x-api-key": ROUTER_KEY})
    assert routed.status_code == 200
    # SMG's admin routes are not reachable through the front, even with a client key
    assert httpx.get(fleet.url + "/workers", headers={"x-api-key": CLIENT_KEY}).status_code == 404


def test_routes_smg_lacks_are_carried_by_the_front(fleet: Fleet) -> None:
    headers = {"authorization": f"Bearer {CLIENT_KEY}"}
    tokens = httpx.post(fleet.url + "/tokenize", json={"prompt": "one two three"}, headers=headers)
    assert tokens.status_code == 200 and tokens.json()["count"] == 3
    counted = anthropic_client(fleet).messages.count_tokens(
        model="fake", messages=[{"role": "user", "content": "one two three"}]
    )
    assert counted.input_tokens > 0
    reply = openai_client(fleet).responses.create(model="fake", input="hi", max_output_tokens=8)
    assert reply.output_text.endswith(" says hi")
    metrics = httpx.get(fleet.url + "/metrics", headers=headers).text
    assert 'sparkfold_fleet_pair_in{pair="a"} 1' in metrics and "sparkfold_fleet_pairs_in 2" in metrics
    assert 'pair="b"' in metrics and 'pair="all"' in metrics and "\nsmg_" in metrics
    assert httpx.get(fleet.url + "/metrics").status_code == 401


def follow_up(fleet: Fleet, conversation: Conversation, text: str) -> dict[str, Any]:
    """``httpx.Client.stream`` arguments for a streamed next turn of ``conversation`` (raw HTTP)."""
    messages = [{"role": "system", "content": conversation.system}, *conversation.turns]
    body = {"model": "fake", "messages": [*messages, {"role": "user", "content": text}], "stream": True}
    url = fleet.url + "/v1/chat/completions"
    return {"method": "POST", "url": url, "json": body, "headers": {"x-api-key": CLIENT_KEY}}


def test_a_full_pair_answers_429_and_the_router_retries_on_the_other(fleet: Fleet) -> None:
    conversation = Conversation("openai")
    conversation.turn(fleet, "first", stream=False)
    (home,) = fleet.served_by(conversation.marker)
    holder, other = fleet.pair(home), next(p for p in fleet.pairs if p.name != home)
    holder.engine.queue(Script(content=["held"] * 5, stall_after=1))  # occupies the pair's one lane
    with httpx.Client(timeout=30) as client, client.stream(**follow_up(fleet, conversation, "hold")):
        holder.engine.wait_for(lambda: holder.engine.active == 1)
        refused_before = holder.requests_with_status(429)
        answer = conversation.turn(fleet, "second", stream=False)  # its prefix lives on the full pair
        assert answer == f"{other.name} says hi"
        assert holder.requests_with_status(429) > refused_before
        assert other.saw(conversation.marker) == 1
    holder.engine.wait_for(lambda: holder.engine.active == 0)  # the held stream ended with its client


def load_until(fleet: Fleet, done: threading.Event, failures: list[str], served: list[int]) -> None:
    """New conversations one after another until ``done`` (bounded: 600 requests or 120 s)."""
    end = time.monotonic() + 120
    while not done.is_set() and len(served) < 600 and time.monotonic() < end:
        try:
            Conversation("openai" if len(served) % 2 else "anthropic").turn(fleet, "ping")
            served.append(1)
        except (openai.APIError, anthropic.APIError) as exc:
            failures.append(repr(exc))


def test_a_stopped_pair_is_ejected_without_failing_requests_and_taken_back(fleet: Fleet) -> None:
    victim = fleet.pair("b")
    done, failures, served = threading.Event(), list[str](), list[int]()
    loader = threading.Thread(target=load_until, args=(fleet, done, failures, served))
    loader.start()
    try:
        fleet.wait_until("load running", lambda h: len(served) >= 5, deadline_s=30)
        fleet.stop_gateway(victim)
        fleet.wait_until("b ejected", lambda h: not h["pairs"][1]["in"], deadline_s=30)
        during = len(served)
        fleet.wait_until("load served without b", lambda h: len(served) >= during + 5, deadline_s=30)
        before_return = len(victim.engine.requests)
        fleet.start_gateway(victim)
        fleet.wait_until("b back", lambda h: h["pairs"][1]["in"], deadline_s=30)
        fleet.wait_until("b serving again", lambda h: len(victim.engine.requests) > before_return, 30)
    finally:
        done.set()
        loader.join(timeout=60)
    assert failures == [], failures[:3]
    assert fleet.health()["pairs_in"] == 2


def test_a_draining_pair_takes_no_new_conversations_and_finishes_its_stream(fleet: Fleet) -> None:
    conversation = Conversation("openai")
    conversation.turn(fleet, "first", stream=False)
    (home,) = fleet.served_by(conversation.marker)
    holder = fleet.pair(home)
    holder.engine.queue(Script(content=[f"tok{i} " for i in range(40)], pace_s=0.05))
    parts: list[str] = []
    request = follow_up(fleet, conversation, "long")
    with httpx.Client(timeout=30) as client, client.stream(**request) as running:
        lines = running.iter_lines()
        parts.append(next(lines))
        # drain: the inventory marks the pair, the router rereads its manifest, the front its pairs
        fleet.write_fleet(draining={home})
        fleet.reload()
        fleet.wait_until(f"{home} drained", lambda h: not h["pairs"][0 if home == "a" else 1]["in"], 30)
        for _ in range(4):
            fresh = Conversation("anthropic")
            fresh.turn(fleet, "new")
            assert fleet.served_by(fresh.marker) == {"b" if home == "a" else "a"}
        parts += [line for line in lines if line]
    assert parts[-1] == "data: [DONE]" and sum('"content":"tok' in p for p in parts) == 40
    fleet.write_fleet()
    fleet.reload()
    fleet.wait_until("both back", lambda h: h["pairs_in"] == 2, 30)
