"""tp = 2 across two network namespaces joined by a veth pair (two "hosts" on one machine).

Rank 0 runs in ``sfe-a`` (203.0.113.129), rank 1 in ``sfe-b`` (203.0.113.130). The HTTP client
runs inside ``sfe-a`` too, since rank 0's engine server listens on that namespace's loopback.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from engine_procs import EngineProcess, free_port, reference_tokens, write_config

pytestmark = [pytest.mark.slow, pytest.mark.netns]

NS_A, NS_B = "sfe-a", "sfe-b"
VETH_A, VETH_B = "sfe-va", "sfe-vb"
ADDR_A, ADDR_B = "203.0.113.129", "203.0.113.130"
PEER_TIMEOUT_S = 5.0
_CLIENT = (
    "import json, sys, httpx\n"
    "body = json.loads(sys.argv[3]) if sys.argv[3] else None\n"
    "try:\n"
    "    r = httpx.request(sys.argv[1], sys.argv[2], json=body, timeout=120)\n"
    "    print(json.dumps({'status': r.status_code, 'body': r.json()}))\n"
    "except httpx.HTTPError as exc:\n"
    "    print(json.dumps({'status': 0, 'body': str(exc)}))\n"
)


def _ip(*args: str, check: bool = True) -> str:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=30).stdout


def _teardown() -> None:
    for ns in (NS_A, NS_B):
        _ip("netns", "del", ns, check=False)


@pytest.fixture(scope="module")
def pair() -> Iterator[None]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 for network namespaces")
    _teardown()  # leftovers of an interrupted run
    try:
        _ip("netns", "add", NS_A)
        _ip("netns", "add", NS_B)
        _ip("link", "add", VETH_A, "type", "veth", "peer", "name", VETH_B)
        _ip("link", "set", VETH_A, "netns", NS_A)
        _ip("link", "set", VETH_B, "netns", NS_B)
        for ns, dev, addr in ((NS_A, VETH_A, ADDR_A), (NS_B, VETH_B, ADDR_B)):
            _ip("-n", ns, "addr", "add", f"{addr}/25", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        assert f"dev {VETH_A}" in _ip("-n", NS_A, "route", "get", ADDR_B)
        assert f"dev {VETH_B}" in _ip("-n", NS_B, "route", "get", ADDR_A)
        yield
    finally:
        _teardown()


def _link_up(up: bool) -> None:
    _ip("-n", NS_B, "link", "set", VETH_B, "up" if up else "down")


def _client(method: str, url: str, body: dict[str, Any] | None = None) -> subprocess.Popen[str]:
    command = ["ip", "netns", "exec", NS_A, sys.executable, "-c", _CLIENT, method, url]
    return subprocess.Popen([*command, json.dumps(body) if body else ""], stdout=subprocess.PIPE, text=True)


def _answer(client: subprocess.Popen[str]) -> tuple[int, Any]:
    out, _ = client.communicate(timeout=180)
    answer = json.loads(out)
    return int(answer["status"]), answer["body"]


def _request(method: str, url: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    return _answer(_client(method, url, body))


def _start_pair(
    smol_dir: Path, tmp_path: Path, engines: list[EngineProcess]
) -> tuple[str, EngineProcess, EngineProcess]:
    _link_up(True)
    port, http_port = free_port(), free_port()
    started = []
    for rank, ns, me, peer in ((1, NS_B, ADDR_B, ADDR_A), (0, NS_A, ADDR_A, ADDR_B)):
        fabric = {
            "address": me,
            "peer": peer,
            "rendezvous_port": port,
            "peer_timeout_s": PEER_TIMEOUT_S,
            "heartbeat_s": 0.5,
        }
        config = write_config(
            tmp_path / f"rank{rank}.toml", smol_dir, rank=rank, tp=2, port=http_port, fabric=fabric
        )
        engine = EngineProcess(config, tmp_path / f"rank{rank}.log", prefix=["ip", "netns", "exec", ns])
        engines.append(engine)
        started.append(engine)
    rank1, rank0 = started
    url = f"http://127.0.0.1:{http_port}"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        for engine in (rank0, rank1):
            if engine.proc.poll() is not None:
                pytest.fail(f"a rank exited with {engine.proc.returncode}:\n{engine.output()[-3000:]}")
        status, body = _request("GET", f"{url}/health")
        if status == 200 and body.get("ok") and "serving smol" in rank0.output():  # READY: probe done
            return url, rank0, rank1
        time.sleep(0.5)
    pytest.fail(f"rank 0 never became healthy:\n{rank0.output()[-3000:]}")


def test_tp2_greedy_output_equals_tp1(
    pair: None, smol_dir: Path, tmp_path: Path, engines: list[EngineProcess]
) -> None:
    url, rank0, rank1 = _start_pair(smol_dir, tmp_path, engines)
    _, health = _request("GET", f"{url}/health")
    assert health["peer"]["rank"] == 1 and health["peer"]["state"] == "ok"
    gloo = subprocess.run(
        ["ip", "netns", "exec", NS_A, "ss", "-tn"], capture_output=True, text=True, timeout=30
    ).stdout
    assert f"{ADDR_B}:" in gloo  # the collectives really run over the fabric link
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(smol_dir)
    prompts = [
        tokenizer.encode(t) for t in ("The capital of France is", "def fibonacci(n):", "Water boils at")
    ]
    bodies = [{"prompt": p, "max_tokens": 24, "temperature": 0, "return_token_ids": True} for p in prompts]
    clients = [_client("POST", f"{url}/v1/completions", body) for body in bodies[:2]]  # two at once
    answers = [_answer(c) for c in clients] + [_request("POST", f"{url}/v1/completions", bodies[2])]
    for prompt, (status, answer) in zip(prompts, answers, strict=True):
        assert status == 200, answer
        assert answer["choices"][0]["token_ids"] == reference_tokens(smol_dir, prompt, 24), prompt
    status, chat = _request(
        "POST",
        f"{url}/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "temperature": 0,
            "max_tokens": 24,
        },
    )
    assert status == 200 and "Paris" in chat["choices"][0]["message"]["content"]
    rank0.signal(signal.SIGTERM)
    assert rank0.wait_exit(60) == 0, rank0.output()[-2000:]
    assert rank1.wait_exit(60) == 0, rank1.output()[-2000:]  # rank 0 told it to stop


def test_killing_rank1_makes_rank0_exit_nonzero_within_the_timeout(
    pair: None, smol_dir: Path, tmp_path: Path, engines: list[EngineProcess]
) -> None:
    _, rank0, rank1 = _start_pair(smol_dir, tmp_path, engines)
    rank1.signal(signal.SIGKILL)
    code = rank0.wait_exit(PEER_TIMEOUT_S + 15)
    assert code is not None and code != 0, rank0.output()[-2000:]
    assert "peer rank 1 at 203.0.113.130 silent" in rank0.output()


def test_link_down_makes_both_ranks_exit_nonzero(
    pair: None, smol_dir: Path, tmp_path: Path, engines: list[EngineProcess]
) -> None:
    _, rank0, rank1 = _start_pair(smol_dir, tmp_path, engines)
    _link_up(False)
    try:
        for rank, engine in ((0, rank0), (1, rank1)):
            code = engine.wait_exit(PEER_TIMEOUT_S + 15)
            assert code is not None and code != 0, engine.output()[-2000:]
            assert f"peer rank {1 - rank}" in engine.output()
    finally:
        _link_up(True)
