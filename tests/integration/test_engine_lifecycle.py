"""Engine rank lifecycle on one host: SIGTERM drain, and refusal when the ranks' settings differ."""

from __future__ import annotations

import json
import signal
import socket
from pathlib import Path

import httpx
import pytest
from engine_procs import EngineProcess, free_port, wait_healthy, write_config

pytestmark = pytest.mark.slow


def test_sigterm_lets_the_in_flight_stream_finish_then_exits_0(
    smol_dir: Path, tmp_path: Path, engines: list[EngineProcess]
) -> None:
    port = free_port()
    engine = EngineProcess(write_config(tmp_path / "e.toml", smol_dir, port=port), tmp_path / "e.log")
    engines.append(engine)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, engine)
    body = {"prompt": "Once upon a time", "max_tokens": 40, "ignore_eos": True, "stream": True}
    events: list[str] = []
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as reply:
        for line in reply.iter_lines():
            if not line.startswith("data: "):
                continue
            events.append(line[6:])
            if len(events) == 1:
                engine.signal(signal.SIGTERM)  # mid-stream
    assert events[-1] == "[DONE]"
    final = json.loads(events[-2])
    assert final["choices"][0]["finish_reason"] == "length"
    assert final["usage"]["completion_tokens"] == 40
    assert engine.wait_exit(60) == 0, engine.output()[-2000:]
    assert "draining in-flight requests" in engine.output()


def test_ranks_with_different_engine_settings_refuse_to_start_naming_the_field(
    smol_dir: Path, tmp_path: Path, engines: list[EngineProcess]
) -> None:
    port = free_port()
    for rank, (me, peer), context in (
        (1, ("127.0.0.2", "127.0.0.1"), 4096),
        (0, ("127.0.0.1", "127.0.0.2"), 2048),
    ):
        fabric = {"address": me, "peer": peer, "rendezvous_port": port, "peer_timeout_s": 60}
        config = write_config(
            tmp_path / f"rank{rank}.toml",
            smol_dir,
            rank=rank,
            tp=2,
            context=context,
            fabric=fabric,
            port=free_port(),
        )
        engines.append(EngineProcess(config, tmp_path / f"rank{rank}.log"))
    for engine in engines:
        assert engine.wait_exit(120) == 1, engine.output()[-2000:]
        out = engine.output()
        assert "engine settings differ between rank 0 and rank 1: engine.context" in out
        assert "Traceback" not in out


def test_systemd_hears_ready_after_the_probe_then_watchdog_pings(
    smol_dir: Path, tmp_path: Path, engines: list[EngineProcess]
) -> None:
    port = free_port()
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify_socket:
        notify_socket.bind(str(tmp_path / "notify.sock"))
        notify_socket.settimeout(120)
        env = {"NOTIFY_SOCKET": str(tmp_path / "notify.sock"), "WATCHDOG_USEC": "1000000"}
        engine = EngineProcess(
            write_config(tmp_path / "e.toml", smol_dir, port=port), tmp_path / "e.log", env=env
        )
        engines.append(engine)
        messages: list[str] = []
        while not any("WATCHDOG=1" in m for m in messages):  # bounded by the socket timeout
            messages.append(notify_socket.recv(512).decode())
            if "READY=1" in messages[-1]:  # READY means the server answers now
                assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).json()["ok"] is True
        ready = next(i for i, m in enumerate(messages) if "READY=1" in m)
        assert any(m.startswith("MAINPID=") for m in messages[:ready])
        assert ready < next(i for i, m in enumerate(messages) if "WATCHDOG=1" in m)
        engine.signal(signal.SIGTERM)
        while "STOPPING=1" not in messages[-1]:  # watchdog pings may still come first
            messages.append(notify_socket.recv(512).decode())
    assert engine.wait_exit(60) == 0


def test_a_busy_port_is_one_clear_line_and_exit_1(
    smol_dir: Path, tmp_path: Path, engines: list[EngineProcess]
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        engine = EngineProcess(write_config(tmp_path / "e.toml", smol_dir, port=port), tmp_path / "e.log")
        engines.append(engine)
        assert engine.wait_exit(120) == 1, engine.output()[-2000:]
    assert f"engine server could not listen on 127.0.0.1:{port}" in engine.output()
    assert "Traceback" not in engine.output()


def test_the_example_config_serves_the_demo_gguf(
    repo: Path, tmp_path: Path, engines: list[EngineProcess]
) -> None:
    port = free_port()
    config = (repo / "examples/local.toml").read_text().replace("port = 18888", f"port = {port}")
    assert f"port = {port}" in config
    (tmp_path / "local.toml").write_text(config)
    engine = EngineProcess(tmp_path / "local.toml", tmp_path / "e.log")
    engines.append(engine)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, engine)
    body = {"messages": [{"role": "user", "content": "What is the capital of France?"}], "temperature": 0}
    answer = httpx.post(f"{url}/v1/chat/completions", json={**body, "max_tokens": 16}, timeout=120).json()
    assert "Paris" in answer["choices"][0]["message"]["content"]
    health = httpx.get(f"{url}/health").json()
    assert health["backend"] == "transformers" and health["peer"] == {"rank": 1, "state": "absent"}
