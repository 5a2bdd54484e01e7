"""The TensorFold stand-in (tests/fakes/fake_tensorfold.py) keeps the reference recipe's engine
behaviours, and the gateway follows it: N lanes over one pool, 429 + Retry-After past the admission
cap, kept prompt states, the recipe's /health and /metrics fields, the peer watch's exits; a gateway
whose api.parallel is left out runs the engine's lanes (4 at once, the fifth queued, past the queue
429) and shows the engine's pool, kept-state and draft fields.

The stand-in runs as a real process on loopback; replies are held open with FAKE_TENSORFOLD_HOLD and
released by ``POST /fake/release``, so nothing here is timed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from tests.fakes.scripted_engine import ServerThread, free_port

from sparkfold.api import create_app
from sparkfold.config import parse
from sparkfold.node.marker import RUN_DIR
from sparkfold.node.peer import record_peer, recorded_peer
from sparkfold.protocol import PeerState

STANDIN = Path(__file__).resolve().parents[1] / "fakes" / "fake_tensorfold.py"
DEADLINE_S = 30.0
CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 6}


class StandIn:
    """``fake_tensorfold.py serve`` as a child process."""

    def __init__(self, *args: str, env: dict[str, str] | None = None, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        command = [sys.executable, str(STANDIN), "serve", "/models/glm", "--port", str(self.port), *args]
        self.proc = subprocess.Popen(
            command,
            env={**os.environ, **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def wait_serving(self) -> None:
        until(lambda: self.health() is not None, "the stand-in serves", self.proc)

    def health(self) -> dict[str, Any] | None:
        try:
            body: dict[str, Any] = httpx.get(f"{self.url}/health", timeout=2).json()
            return body
        except httpx.HTTPError:
            return None

    def release(self) -> None:
        httpx.post(f"{self.url}/fake/release", content=b"{}", timeout=5).raise_for_status()

    def exit_code(self) -> tuple[int, str]:
        code = self.proc.wait(timeout=DEADLINE_S)
        return code, self.proc.stdout.read() if self.proc.stdout else ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=DEADLINE_S)


def until(condition: Callable[[], object], what: str, proc: subprocess.Popen[str] | None = None) -> None:
    """Poll ``condition`` (bounded) until it holds."""
    deadline = time.monotonic() + DEADLINE_S
    while not condition():
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"{what}: the process exited with {proc.returncode}")
        if time.monotonic() > deadline:
            pytest.fail(f"not after {DEADLINE_S} s: {what}")
        time.sleep(0.02)


@contextlib.contextmanager
def standin(*args: str, **env: str) -> Iterator[StandIn]:
    engine = StandIn(*args, env=env)
    try:
        engine.wait_serving()
        yield engine
    finally:
        engine.stop()


def gateway_settings(engine: StandIn, **engine_fields: Any) -> Any:
    """The gateway's settings for a tensorfold engine at the stand-in's port."""
    return parse(
        {
            "engine": {
                "kind": "tensorfold",
                "model": "/models/glm",
                "served_name": "glm",
                "port": engine.port,
            }
            | engine_fields,
            "api": {"host": "127.0.0.1", "port": 1},
        }
    )


class Stream:
    """A streamed chat request held open in a thread; ``first`` is set at its first event."""

    def __init__(self, client: httpx.Client, path: str = "/v1/chat/completions") -> None:
        self.first = threading.Event()
        self.status: int | None = None
        self.text = ""
        self.headers: dict[str, str] = {}
        self.thread = threading.Thread(target=self._run, args=(client, path), daemon=True)
        self.thread.start()

    def _run(self, client: httpx.Client, path: str) -> None:
        with client.stream("POST", path, json=CHAT | {"stream": True}) as response:
            self.status, self.headers = response.status_code, dict(response.headers)
            for line in response.iter_lines():
                self.first.set()
                self.text += line + "\n"
        self.first.set()

    def done(self) -> str:
        self.thread.join(timeout=DEADLINE_S)
        assert not self.thread.is_alive(), "the stream did not end"
        return self.text


def test_lanes_over_one_pool_queue_then_429_with_retry_after() -> None:
    with standin("--parallel", "2", FAKE_TENSORFOLD_HOLD="1", TF_GLM_MAX_QUEUED="1") as engine:
        client = httpx.Client(base_url=engine.url, timeout=DEADLINE_S)
        streams = [Stream(client), Stream(client)]
        for stream in streams:
            assert stream.first.wait(DEADLINE_S)
        health = engine.health() or {}
        assert health["requests_running"] == 2 and health["streams"]["decoding"] == 2
        queued = Stream(client)
        until(lambda: (engine.health() or {}).get("requests_waiting") == 1, "the third request queues")
        refused = client.post("/v1/chat/completions", json=CHAT)
        assert refused.status_code == 429 and refused.headers["retry-after"] == "5"
        assert "TF_GLM_MAX_QUEUED" in refused.json()["error"]["message"]
        engine.release()
        for stream in [*streams, queued]:
            assert stream.done().rstrip().endswith("data: [DONE]") and stream.status == 200
        assert (engine.health() or {})["requests_total"] == 3


def test_kept_states_resume_and_health_and_metrics_carry_the_recipe_fields() -> None:
    with standin("--parallel", "4", "--drafter", "/models/dflash2", TF_GLM_CACHE_ENTRIES="2") as engine:
        client = httpx.Client(base_url=engine.url, timeout=DEADLINE_S)
        first = client.post("/v1/chat/completions", json=CHAT).json()
        again = client.post("/v1/chat/completions", json=CHAT).json()
        assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        prompt = again["usage"]["prompt_tokens"]
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == prompt > 0
        for content in ("a", "b", "c"):  # past TF_GLM_CACHE_ENTRIES the oldest state goes
            other = {**CHAT, "messages": [{"role": "user", "content": content}]}
            client.post("/v1/chat/completions", json=other)
        health = engine.health() or {}
        assert health["kept_prompts"] == 2 and health["cached_tokens_total"] == prompt
        assert health["pool_free_tokens"] < health["pool_tokens"] == 2_922_496
        assert health["drafted_total"] > 0 and {"own", "shared"} <= set(health["kept_mix"])
        metrics = client.get("/metrics").text
        assert "tensorfold_health:kept_prompts 2" in metrics and "tensorfold:requests_waiting 0" in metrics


def pair(rendezvous: int, **env: str) -> tuple[StandIn, StandIn]:
    common = ["--tp", "2", "--master", "127.0.0.1", "--master-port", str(rendezvous)]
    env = {"FAKE_TENSORFOLD_RENDEZVOUS": "1", **env}
    head = StandIn(*common, "--rank", "0", env=env)
    worker = StandIn(*common, "--rank", "1", env=env)
    head.wait_serving()
    return head, worker


def test_peer_watch_rank0_exits_when_rank1_falls_silent() -> None:
    head, worker = pair(free_port(), TENSORFOLD_PEER_TIMEOUT_S="1")
    try:
        worker.proc.send_signal(signal.SIGSTOP)  # alive but silent: no more beats
        code, output = head.exit_code()
        assert code == 1
        assert "rank 1 showed no sign of life for 1 s (TENSORFOLD_PEER_TIMEOUT_S)" in output
    finally:
        worker.proc.send_signal(signal.SIGCONT)
        head.stop()
        worker.stop()


def test_peer_watch_after_a_clean_stop_the_worker_runs_until_stopped() -> None:
    head, worker = pair(free_port(), TENSORFOLD_PEER_TIMEOUT_S="30")
    try:
        head.proc.send_signal(signal.SIGTERM)
        assert head.exit_code()[0] == 0
        assert worker.proc.poll() is None
        worker.proc.send_signal(signal.SIGTERM)
        code, output = worker.exit_code()
        assert code == 0 and "rank 0 stopped cleanly" in output
    finally:
        head.stop()
        worker.stop()


def test_gateway_lanes_follow_an_engine_with_parallel_4(tmp_path: Path) -> None:
    # the head's engine supervisor records its peer watch (the stand-in, like TensorFold, has none)
    (tmp_path / RUN_DIR).mkdir(parents=True)
    (tmp_path / "proc" / str(os.getpid())).mkdir(parents=True)
    record_peer(
        PeerState(rank=1, state="ok", last_seen_s=0.5), {"RUNTIME_DIRECTORY": str(tmp_path / RUN_DIR)}
    )
    with standin("--parallel", "4", "--drafter", "/models/dflash2", FAKE_TENSORFOLD_HOLD="1") as engine:
        settings = parse(
            {
                "engine": {
                    "kind": "tensorfold",
                    "model": "/models/glm",
                    "served_name": "glm",
                    "port": engine.port,
                    "parallel": 4,
                },
                "api": {"host": "127.0.0.1", "port": 1, "max_queued": 1},  # parallel left out
            }
        )
        assert settings.api.parallel == 4
        with ServerThread(create_app(settings, peer_state=lambda: recorded_peer(tmp_path))) as gateway:
            client = httpx.Client(base_url=gateway.url, timeout=DEADLINE_S)
            streams = [Stream(client) for _ in range(4)]
            for stream in streams:
                assert stream.first.wait(DEADLINE_S)
            assert (engine.health() or {})["requests_running"] == 4
            fifth = Stream(client)
            until(lambda: client.get("/health").json()["queue"]["length"] == 1, "the fifth request queues")
            assert (engine.health() or {})["requests_waiting"] == 0, "the gateway queues, not the engine"
            sixth = client.post("/v1/chat/completions", json=CHAT)
            assert sixth.status_code == 429 and int(sixth.headers["retry-after"]) > 0
            health = client.get("/health").json()
            assert {key: health["lanes"][key] for key in ("total", "busy", "free")} == {
                "total": 4,
                "busy": 4,
                "free": 0,
            }
            assert health["lanes"]["engine_busy"] == 4  # the engine's own count, from its /health
            # its streams object counts no lanes: engine_total is the configured engine.parallel
            assert health["lanes"]["engine_total"] == 4
            assert health["peer"] == {"rank": 1, "state": "ok", "last_seen_s": 0.5} and health["ok"]
            assert health["engine"]["streams"] == {"decoding": 4, "filling": 0, "paused": 0}
            assert health["engine"]["pool_tokens"] == 2_922_496 and "kept_prompts" in health["engine"]
            assert "drafted_total" in health["engine"] and "kept_bytes_cap" in health["engine"]
            engine.release()
            for stream in [*streams, fifth]:
                assert stream.done().rstrip().endswith("data: [DONE]") and stream.status == 200
            assert "tensorfold_health:pool_tokens 2922496" in client.get("/metrics").text


def test_the_gateway_refuses_what_tensorfold_cannot_give_naming_it() -> None:
    """TensorFold's /v1/models card has no capabilities block: log-probabilities, several choices and
    a list of prompts are a 400 that names the engine, before a lane is taken."""
    with standin() as engine:
        settings = gateway_settings(engine)
        with ServerThread(create_app(settings)) as gateway:
            client = httpx.Client(base_url=gateway.url, timeout=DEADLINE_S)
            asks = [
                ("/v1/chat/completions", CHAT | {"n": 2}, "n"),
                ("/v1/chat/completions", CHAT | {"logprobs": True}, "logprobs"),
                ("/v1/chat/completions", CHAT | {"logprobs": True, "top_logprobs": 2}, "logprobs"),
                ("/v1/completions", {"prompt": ["a", "b"], "max_tokens": 2}, "prompt"),
                ("/v1/completions", {"prompt": "a", "max_tokens": 2, "logprobs": 1}, "logprobs"),
            ]
            for path, body, param in asks:
                reply = client.post(path, json=body)
                assert reply.status_code == 400, (body, reply.text)
                error = reply.json()["error"]
                assert error["param"] == param and "tensorfold engine" in error["message"], error
            assert (engine.health() or {})["requests_total"] == 0  # none reached the engine
            assert client.post("/v1/chat/completions", json=CHAT).status_code == 200


def test_anthropic_message_start_counts_the_prompt_with_tensorfold_tokenize() -> None:
    """TensorFold puts no prompt usage on its first chunk: the gateway counts the prompt with the
    engine's /tokenize, so message_start (sent while the engine still holds the reply after its
    first chunk) carries what the engine bills as input tokens."""
    with standin(FAKE_TENSORFOLD_HOLD="1") as engine:
        settings = gateway_settings(engine)
        with ServerThread(create_app(settings)) as gateway:
            claude = anthropic.Anthropic(base_url=gateway.url, api_key="unused", max_retries=0)
            ask: Any = [{"role": "user", "content": "hello there"}]
            stream = claude.messages.create(model="glm", max_tokens=4, messages=ask, stream=True)
            events = iter(stream)
            start = next(events)
            assert start.type == "message_start"
            engine.release()
            assert [e.type for e in events][-1] == "message_stop"
            usage = claude.messages.create(model="glm", max_tokens=4, messages=ask).usage
            billed = usage.input_tokens + (usage.cache_read_input_tokens or 0)  # the whole prompt
            assert billed > 0 and start.message.usage.input_tokens == billed
            assert claude.messages.count_tokens(model="glm", messages=ask).input_tokens == billed
