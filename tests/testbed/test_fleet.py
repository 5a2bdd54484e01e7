"""The fleet testbed (``make demo-fleet``): two one-node pairs behind the router on sffl-a, built by
``playbooks/testbed.yml`` and converged by ``site.yml`` from ``inventory/fleet-testbed``; clients
through the official SDKs, at the router only.

Which pair served a request is read from the pairs' own gateway metrics (``sparkfold_requests_total``,
fetched over ssh on each pair's loopback: the gateway filter lets nothing else in), never from the
router. The tests share one fleet and run in file order; the last ones stop a pair and reinstall
the router. The fleet is torn down at the end unless ``SPARKFOLD_TESTBED_KEEP=1``;
``SPARKFOLD_TESTBED_REUSE=1`` takes a fleet testbed that is already up and converged (``make
demo-fleet``) as it is, without building and converging it first. Only here: ``-m fleet``.
"""

from __future__ import annotations

import os
import shlex
import shutil
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from testbed_kit import REPO, play, ssh, unit, wait_for

pytestmark = [pytest.mark.testbed, pytest.mark.fleet, pytest.mark.slow, pytest.mark.timeout(2400)]

INVENTORY = "inventory/fleet-testbed"
PAIRS = {"pair-a": "198.51.100.130", "pair-b": "198.51.100.131"}
ROUTER_HOST = PAIRS["pair-a"]  # inventory/fleet-testbed/hosts.yml: the router runs on pair a's head
ROUTER = f"http://{ROUTER_HOST}:8800"
MODEL = "SmolLM2-135M-Instruct"
CREDENTIALS = REPO / ".cache/control/credentials/fleet-testbed"
HEALTH_INTERVAL_S = 2  # inventory/fleet-testbed/group_vars/all/router.yml
SYSTEM = "You answer in one short sentence. " * 12

# Run on a pair's head: its own gateway's /metrics on loopback, with the key read from stdin.
FETCH = (
    "import sys, urllib.request; key = sys.stdin.read().strip(); "
    "req = urllib.request.Request('http://127.0.0.1:8888/metrics', headers={'x-api-key': key}); "
    "print(urllib.request.urlopen(req, timeout=20).read().decode())"
)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The fleet testbed built and converged once for this module; its run folders."""
    if os.geteuid() != 0 or not (shutil.which("systemd-nspawn") and shutil.which("debootstrap")):
        pytest.skip("the fleet testbed needs root, systemd-nspawn and debootstrap")
    artifacts = tmp_path_factory.mktemp("fleet")
    try:
        if os.environ.get("SPARKFOLD_TESTBED_REUSE") != "1":
            play(artifacts / "testbed", "playbooks/testbed.yml", inventory=INVENTORY).must_succeed()
            play(artifacts / "converge-1", "site.yml", inventory=INVENTORY).must_succeed()
        yield artifacts
    finally:
        if os.environ.get("SPARKFOLD_TESTBED_KEEP") != "1":
            play(artifacts / "teardown", "playbooks/teardown.yml", inventory=INVENTORY).must_succeed()


@pytest.fixture(scope="module")
def client_key(fleet: Path) -> str:
    return (CREDENTIALS / "api-key").read_text().strip()


@pytest.fixture(scope="module")
def router_key(fleet: Path) -> str:
    return (CREDENTIALS / "router-key").read_text().strip()


def counters(pair: str, router_key: str) -> dict[str, float]:
    """The pair's own gateway counters: chat/messages requests answered 200, and 429s."""
    text = ssh(PAIRS[pair], f"python3 -c {shlex.quote(FETCH)}", stdin=router_key)
    served = rejected = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "sparkfold_requests_total" and sample.labels.get("status") == "200":
                if sample.labels.get("route") in ("/v1/chat/completions", "/v1/messages"):
                    served += sample.value
            elif sample.name == "sparkfold_rejected_total":
                rejected += sample.value
    return {"served": served, "rejected": rejected}


def served_by(router_key: str, before: dict[str, dict[str, float]]) -> set[str]:
    """The pairs whose served count grew since ``before`` (and moves ``before`` on)."""
    grew = set()
    for pair in PAIRS:
        now = counters(pair, router_key)
        if now["served"] > before[pair]["served"]:
            grew.add(pair)
        before[pair] = now
    return grew


def fleet_health() -> dict[str, object]:
    return httpx.get(ROUTER + "/health", timeout=10).json()


def pairs_in() -> set[str]:
    return {p["name"] for p in fleet_health()["pairs"] if p["in"]}  # type: ignore[index, union-attr]


class Conversation:
    """A multi-turn conversation with a unique opening; every turn resends the whole history."""

    def __init__(self, dialect: str, key: str) -> None:
        self.marker = uuid.uuid4().hex[:12]
        self.dialect = dialect
        self.key = key
        self.system = f"[{self.marker}] {SYSTEM}"
        self.turns: list[dict[str, str]] = []
        self.answers: list[str] = []
        self.timeout_s = 120.0

    def turn(self, text: str, *, max_tokens: int = 8) -> str:
        self.turns.append({"role": "user", "content": text})
        answer = self._openai(max_tokens) if self.dialect == "openai" else self._anthropic(max_tokens)
        self.answers.append(answer)
        self.turns.append({"role": "assistant", "content": answer or "(no text)"})
        return answer

    def _openai(self, max_tokens: int) -> str:
        client = openai.OpenAI(
            base_url=ROUTER + "/v1", api_key=self.key, max_retries=0, timeout=self.timeout_s
        )
        messages = [{"role": "system", "content": self.system}, *self.turns]
        chunks = client.chat.completions.create(
            model=MODEL,
            messages=messages,  # type: ignore[arg-type]
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
        )
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    def _anthropic(self, max_tokens: int) -> str:
        client = anthropic.Anthropic(base_url=ROUTER, api_key=self.key, max_retries=0, timeout=120)
        with client.messages.stream(
            model=MODEL,
            max_tokens=max_tokens,
            system=self.system,
            messages=self.turns,  # type: ignore[arg-type]
        ) as events:
            return "".join(events.text_stream)


def test_a_second_converge_changes_nothing(fleet: Path) -> None:
    again = play(fleet / "converge-2", "site.yml", inventory=INVENTORY).must_succeed()
    assert set(again.stats.get("ok", {})) == {"sffl-a", "sffl-b"}
    assert sum(again.changed.values()) == 0, f"changed: {again.changed}"
    assert (
        "curl http://198.51.100.130:8800/v1/chat/completions"
        in (REPO / ".cache/control/fleet-testbed-router-curl.txt").read_text()
    )


def test_keys_are_required_at_the_router(fleet: Path, client_key: str, router_key: str) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert httpx.post(ROUTER + "/v1/chat/completions", json=body, timeout=30).status_code == 401
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=ROUTER + "/v1", api_key="sk-wrong", max_retries=0).chat.completions.create(
            **body  # type: ignore[arg-type]
        )
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=ROUTER, api_key="sk-wrong", max_retries=0).messages.create(
            model=MODEL, max_tokens=2, messages=[{"role": "user", "content": "hi"}]
        )
    # the router's own key is for the pairs, not for clients of the fleet
    assert (
        httpx.post(ROUTER + "/v1/chat/completions", json=body, headers={"x-api-key": router_key}, timeout=30)
    ).status_code == 401
    reply = openai.OpenAI(base_url=ROUTER + "/v1", api_key=client_key, max_retries=0, timeout=120)
    assert reply.chat.completions.create(**body).choices[0].message.content is not None  # type: ignore[arg-type]


def test_only_the_router_host_reaches_a_pairs_gateway(fleet: Path) -> None:
    """The gateway filter: this host (198.51.100.129, on the management bridge) is dropped; the
    router host and the pair's own loopback get through."""
    probe = "python3 -c \"import urllib.request as u; print(u.urlopen('{url}', timeout=10).status)\""
    for pair, address in PAIRS.items():
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://{address}:8888/health", timeout=3)
        assert ssh(address, probe.format(url="http://127.0.0.1:8888/health")) == "200", pair
        assert ssh(ROUTER_HOST, probe.format(url=f"http://{address}:8888/health")) == "200", pair
        rules = ssh(address, "nft list table inet sparkfold_gateway")
        assert "elements = { 198.51.100.130 }" in rules and "counter packets" in rules and "drop" in rules
        # everything else on the node stays reachable: its ssh, which this test is using
    assert httpx.get(ROUTER + "/health", timeout=10).status_code == 200


def test_conversations_stay_on_one_pair_while_new_ones_spread(
    fleet: Path, client_key: str, router_key: str
) -> None:
    before = {pair: counters(pair, router_key) for pair in PAIRS}
    conversations = [Conversation("openai" if i % 2 == 0 else "anthropic", client_key) for i in range(6)]
    homes: list[set[str]] = [set() for _ in conversations]
    for turn in range(3):
        for conversation, home in zip(conversations, homes, strict=True):
            conversation.turn(f"Question {turn}: name a colour.")
            home |= served_by(router_key, before)
    assert all(len(home) == 1 for home in homes), f"a conversation moved between pairs: {homes}"
    assert set().union(*homes) == set(PAIRS), f"every new conversation went to {homes[0]}"


def test_a_full_pair_answers_429_and_the_router_retries_on_the_other(
    fleet: Path, client_key: str, router_key: str
) -> None:
    """Each pair has one lane and one queue place (inventory api.yml): two long streams of a
    conversation that lives on one pair fill it; its next turn is refused there and served by the other."""
    before = {pair: counters(pair, router_key) for pair in PAIRS}
    conversation = Conversation("openai", client_key)
    conversation.turn("Question 0: name a colour.")
    (home,) = served_by(router_key, before)
    (other,) = set(PAIRS) - {home}
    holders = [Conversation("openai", client_key) for _ in range(2)]
    for holder in holders:  # the same history: the router sends them where it lives
        holder.timeout_s = 600  # the second one waits in the pair's queue behind the first
        holder.marker, holder.system, holder.turns = (
            conversation.marker,
            conversation.system,
            list(conversation.turns),
        )
    threads = [
        threading.Thread(
            target=h.turn, args=("Write a long story about the sea.",), kwargs={"max_tokens": 160}
        )
        for h in holders
    ]
    for thread in threads:
        thread.start()
    try:
        wait_for(
            f"{home} busy with two streams",
            lambda: (
                "sparkfold_queue_length 1.0"
                in ssh(PAIRS[home], f"python3 -c {shlex.quote(FETCH)}", stdin=router_key)
            ),
            timeout_s=120,
            every_s=1,
        )
        answer = conversation.turn("Question 1: name another colour.")
    finally:
        for thread in threads:
            thread.join(timeout=300)
    assert answer is not None
    assert [len(h.answers) for h in holders] == [1, 1], "a holding stream did not finish"
    after = {pair: counters(pair, router_key) for pair in PAIRS}
    assert after[home]["rejected"] > before[home]["rejected"], "the full pair never answered 429"
    assert after[other]["served"] > before[other]["served"], "the other pair did not serve the retry"


def test_a_stopped_pair_is_ejected_without_failed_requests_and_taken_back(
    fleet: Path, client_key: str, router_key: str
) -> None:
    stopped, kept = "pair-b", "pair-a"
    client = openai.OpenAI(base_url=ROUTER + "/v1", api_key=client_key, max_retries=0, timeout=120)
    outcomes: list[tuple[float, str]] = []
    done = threading.Event()

    def load() -> None:  # sequential, bounded in count and time
        deadline = time.monotonic() + 600
        for i in range(200):
            if done.is_set() or time.monotonic() > deadline:
                return
            try:
                client.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": f"[{uuid.uuid4().hex[:8]}] Say {i}."}],
                    max_tokens=4,
                )
                outcomes.append((time.monotonic(), "ok"))
            except openai.OpenAIError as exc:
                outcomes.append((time.monotonic(), f"{type(exc).__name__}: {exc}"))

    runner = threading.Thread(target=load)
    runner.start()
    try:
        wait_for("load under way", lambda: len(outcomes) >= 3, timeout_s=120, every_s=0.5)
        ssh(PAIRS[stopped], "systemctl stop sparkfold-api.service")
        stopped_at = time.monotonic()
        wait_for(
            f"{stopped} out of the fleet's /health",
            lambda: stopped not in pairs_in(),
            timeout_s=60,
            every_s=0.5,
        )
        marks = len(outcomes)
        wait_for(
            "load served by the other pair", lambda: len(outcomes) >= marks + 3, timeout_s=120, every_s=0.5
        )
        ssh(PAIRS[stopped], "systemctl start sparkfold-api.service")
        wait_for(
            f"{stopped} back in the fleet's /health", lambda: stopped in pairs_in(), timeout_s=120, every_s=1
        )
    finally:
        done.set()
        runner.join(timeout=180)
    failed = [
        (at - stopped_at, what)
        for at, what in outcomes
        if what != "ok" and at > stopped_at + HEALTH_INTERVAL_S
    ]
    assert not failed, f"requests failed after the first health interval: {failed}"
    assert kept in pairs_in()
    # taken back: new conversations reach it again (bounded: the router spreads them)
    before = {pair: counters(pair, router_key) for pair in PAIRS}
    reached: set[str] = set()
    for _ in range(6):
        Conversation("anthropic", client_key).turn("Question 0: name a colour.")
        reached |= served_by(router_key, before)
        if stopped in reached:
            break
    assert stopped in reached, f"{stopped} is in /health but took no new conversation"


def test_a_router_reinstall_on_a_pair_head_restarts_the_router_only(fleet: Path) -> None:
    """sffl-a is pair a's head and the router: a new router wheel restarts the router, never the
    pair's engine or gateway (the runtime's install tasks notify the router's topic here)."""
    engine, api, router = (
        unit(ROUTER_HOST, f"{name}.service")
        for name in ("sparkfold-engine", "sparkfold-api", "sparkfold-router")
    )
    ssh(ROUTER_HOST, "rm -f /opt/sparkfold/router-wheelhouse/sparkfold-*.whl")
    run = play(fleet / "router-reinstall", "playbooks/router.yml", inventory=INVENTORY).must_succeed()
    assert run.changed.get("sffl-a", 0) > 0
    assert unit(ROUTER_HOST, "sparkfold-router.service")["InvocationID"] != router["InvocationID"]
    assert unit(ROUTER_HOST, "sparkfold-engine.service")["InvocationID"] == engine["InvocationID"]
    assert unit(ROUTER_HOST, "sparkfold-api.service")["InvocationID"] == api["InvocationID"]
    wait_for("pair-a back in the fleet", lambda: "pair-a" in pairs_in(), timeout_s=120, every_s=1)
