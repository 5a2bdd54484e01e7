"""The engine core in a process of its own (``[engine] core_process = true``), for real, on CPU.

The transformers engine on SmolLM2 (and the tiny GLM for structured output) behind a real
``sparkfold engine``: the same greedy tokens as in-process, streaming, a client that leaves
frees its lane in the core, lanes and the 503, the core killed (``/health`` 503, requests fail,
the server stays up), SIGTERM ends both processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import psutil
import pytest
from engine_procs import (
    EngineProcess,
    alone_and_together,
    free_port,
    reference_tokens,
    wait_healthy,
    write_config,
)

pytestmark = pytest.mark.slow

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def _core(engine: EngineProcess) -> psutil.Process:
    """The engine core: the server's one python child."""
    (child,) = psutil.Process(engine.proc.pid).children()
    assert "sparkfold.engines.core.main" in child.cmdline()
    return child


def start_core(tmp: Path, model: Path, *, healthy: bool = True, **engine: Any) -> tuple[str, EngineProcess]:
    """``sparkfold engine`` with ``core_process = true`` on ``model``: its URL and process, once
    ``/health`` is ok (``healthy=False``: at once). The caller stops it."""
    port = free_port()
    config = write_config(tmp / "core.toml", model, port=port, core_process=True, **engine)
    process = EngineProcess(config, tmp / "core.log")
    url = f"http://127.0.0.1:{port}"
    if healthy:
        try:
            wait_healthy(url, process)
        except BaseException:
            process.stop()
            raise
    return url, process


def wait_idle(server: str) -> None:
    """Until ``/health`` counts no request running (bounded): the core has ended those that left."""
    health: dict[str, int] = {}
    for _ in range(300):
        health = httpx.get(f"{server}/health").json()
        if health["requests_running"] == 0:
            break
        time.sleep(0.1)
    assert health["requests_running"] == 0


def stream_events(url: str, body: dict[str, Any], after_first: Callable[[], None]) -> list[str]:
    """A streamed completion (``ignore_eos``) read to its end: its ``data:`` payloads; ``after_first``
    runs once the first has come."""
    events: list[str] = []
    request = {**body, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=request, timeout=120) as reply:
        for line in reply.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
                if len(events) == 1:
                    after_first()
    return events


@pytest.fixture(scope="module")
def served(smol_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, EngineProcess]]:
    """The one engine (and core) of this module's tests that leave it serving."""
    url, engine = start_core(tmp_path_factory.mktemp("core"), smol_dir)
    try:
        yield url, engine
    finally:
        engine.stop()


@pytest.fixture
def own_core(smol_dir: Path, tmp_path: Path, engines: list[EngineProcess]) -> tuple[str, EngineProcess]:
    """An engine (and core) of this test's own, for a test that kills or stops it."""
    url, engine = start_core(tmp_path, smol_dir)
    engines.append(engine)
    return url, engine


@pytest.fixture
def server(served: tuple[str, EngineProcess]) -> str:
    return served[0]


def test_greedy_equals_plain_generate_through_the_core(server: str, smol_dir: Path) -> None:
    prompt = httpx.post(f"{server}/tokenize", json={"messages": QUESTION}).json()["tokens"]
    body = {"prompt": prompt, "max_tokens": 20, "temperature": 0, "return_token_ids": True}
    served = httpx.post(f"{server}/v1/completions", json=body, timeout=120).json()["choices"][0]["token_ids"]
    assert served == reference_tokens(smol_dir, prompt, 20)


def test_a_stream_and_its_logprobs_come_through_the_core(server: str) -> None:
    body = {
        "messages": QUESTION,
        "max_tokens": 12,
        "temperature": 0,
        "stream": True,
        "logprobs": True,
        "top_logprobs": 2,
        "ignore_eos": True,
        "stream_options": {"include_usage": True},
    }
    chunks = []
    with httpx.stream("POST", f"{server}/v1/chat/completions", json=body, timeout=120) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    plain = httpx.post(f"{server}/v1/chat/completions", json={**body, "stream": False}, timeout=120).json()
    assert streamed == plain["choices"][0]["message"]["content"]
    assert chunks[-1]["usage"]["completion_tokens"] == 12
    logprobs = plain["choices"][0]["logprobs"]["content"]
    assert len(logprobs) == 12 and all(len(entry["top_logprobs"]) == 2 for entry in logprobs)


def test_concurrent_requests_get_what_they_get_alone(server: str) -> None:
    prompts = ["The capital of France is", "One, two, three,"]

    alone, together = alone_and_together(server, prompts)
    assert alone == together


def test_a_client_that_leaves_frees_its_lane_in_the_core(server: str) -> None:
    body = {
        "prompt": "Count from one to one hundred:",
        "max_tokens": 1500,
        "ignore_eos": True,
        "stream": True,
    }
    for _ in range(3):  # parallel = 2: a lane that stayed taken would turn the third into a 503
        with httpx.stream("POST", f"{server}/v1/completions", json=body, timeout=60) as reply:
            for line in reply.iter_lines():
                if line.startswith("data: "):
                    break  # first token arrived; leave
    wait_idle(server)
    short = {"prompt": "Hello", "max_tokens": 2}

    async def both() -> list[int]:
        async with httpx.AsyncClient(timeout=120) as http:
            replies = await asyncio.gather(
                *(http.post(f"{server}/v1/completions", json=short) for _ in range(2))
            )
        return [r.status_code for r in replies]

    assert asyncio.run(both()) == [200, 200]  # both lanes are free again


def test_past_its_lanes_the_engine_answers_503_capacity(server: str) -> None:
    long = {"prompt": "Once upon a time", "max_tokens": 1500, "ignore_eos": True, "stream": True}
    lines = []  # each stream's line iterator, kept: one dropped would close its connection
    with contextlib.ExitStack() as streams:
        for _ in range(2):  # parallel = 2: both lanes generating (a first token came) ...
            reply = streams.enter_context(httpx.stream("POST", f"{server}/v1/completions", json=long))
            lines.append(reply.iter_lines())
            assert next(line for line in lines[-1] if line.startswith("data: "))
        # ... for far longer than the 2 s a third request waits for a lane
        third = httpx.post(f"{server}/v1/completions", json={"prompt": "Hello", "max_tokens": 2}, timeout=60)
    assert third.status_code == 503 and third.json()["error"]["code"] == "capacity"
    wait_idle(server)  # the two that left are ended in the core: the lanes are free for the next test


def test_structured_output_through_the_core(tmp_path: Path, engines: list[EngineProcess]) -> None:
    from sparkfold.testing.tiny_glm import write_tiny_glm

    schema = {
        "type": "object",
        "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["ok", "n"],
        "additionalProperties": False,
    }
    model = write_tiny_glm(tmp_path / "model")
    url, engine = start_core(tmp_path, model, served_name="glm", thinking=False)
    engines.append(engine)
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    body = {"messages": [{"role": "user", "content": "JSON"}], "response_format": fmt, "max_tokens": 48}
    for seed in range(2):
        reply = httpx.post(
            f"{url}/v1/chat/completions", json={**body, "seed": seed, "temperature": 1.0}, timeout=120
        )
        assert reply.status_code == 200, reply.text
        choice = reply.json()["choices"][0]
        assert choice["finish_reason"] == "stop"
        jsonschema.validate(json.loads(choice["message"]["content"]), schema)
    bad = httpx.post(f"{url}/v1/chat/completions", json={**body, "guided_regex": "("}, timeout=60)
    assert bad.status_code == 400 and "guided_regex" in bad.text  # refused here, the core never sees it


def test_the_core_killed_makes_health_and_requests_503_and_ends_streams_with_an_error(
    own_core: tuple[str, EngineProcess],
) -> None:
    url, engine = own_core
    core = _core(engine)

    def kill() -> None:  # the first token is out: the core dies mid-stream
        core.kill()
        core.wait(timeout=30)

    events = stream_events(url, {"prompt": "Once upon a time", "max_tokens": 1500}, after_first=kill)
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert error["code"] == "engine_unavailable" and "engine core" in error["message"], error
    health = httpx.get(f"{url}/health")
    for _ in range(100):  # bounded: the server's reader has seen the end of the connection by now
        if health.status_code == 503:
            break
        time.sleep(0.1)
        health = httpx.get(f"{url}/health")
    assert health.status_code == 503 and health.json()["ok"] is False
    reply = httpx.post(f"{url}/v1/completions", json={"prompt": "Hello", "max_tokens": 4}, timeout=60)
    assert reply.status_code == 503, reply.text  # unavailable (clients and the gateway retry), not a bug
    assert reply.json()["error"]["code"] == "engine_unavailable"
    assert "engine core" in reply.json()["error"]["message"]
    assert engine.proc.poll() is None  # the server stays up (the watchdog, not a crash, restarts it)


def test_sigterm_drains_then_stops_the_server_and_its_core(own_core: tuple[str, EngineProcess]) -> None:
    url, engine = own_core
    core = _core(engine)
    body = {"prompt": "Once upon a time", "max_tokens": 30}
    # SIGTERM mid-stream: the core keeps generating through the drain
    events = stream_events(url, body, after_first=lambda: engine.signal(signal.SIGTERM))
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["usage"]["completion_tokens"] == 30
    assert engine.wait_exit(60) == 0, engine.output()[-2000:]
    core.wait(timeout=30)  # raises if the core outlived its server


def test_the_server_killed_takes_its_core_along(own_core: tuple[str, EngineProcess]) -> None:
    _, engine = own_core
    core = _core(engine)
    engine.proc.kill()  # SIGKILL: no drain, no close message
    engine.proc.wait(timeout=30)
    core.wait(timeout=30)  # the end of the connection: it exits by itself (not a process_guard kill)


def test_a_load_error_in_the_core_is_the_same_clear_line(
    tmp_path: Path, engines: list[EngineProcess]
) -> None:
    model = tmp_path / "no-model"
    model.mkdir()
    _, engine = start_core(tmp_path, model, healthy=False)
    engines.append(engine)
    assert engine.wait_exit(120) == 1
    output = engine.output()
    assert "Error:" in output and str(model) in output, output[-2000:]
    assert "Traceback" not in output
