"""``sparkfold engine`` with ``kind = "tensorfold"``: launch, readiness, serving, stop, peer loss.

The ranks are real ``sparkfold engine`` processes; TensorFold is the fake from tests/fakes (the
fake ``docker`` on PATH records its argv and execs ``fake_tensorfold.py``, which follows the
engine protocol and really rendezvouses with its peer). The "link" is loopback: the head on
127.0.0.1, the worker on 127.0.0.2.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
import tomli_w
from engine_procs import EngineProcess, free_port, wait_healthy

from sparkfold.config import load
from sparkfold.conformance import run as conformance

FAKES = Path(__file__).resolve().parents[1] / "fakes"
PEER_TIMEOUT_S = 3.0
DEADLINE_S = 60.0


def pair_config(repo: Path, tmp_path: Path, name: str, port: int, rendezvous: int) -> Path:
    """The example pair's file with loopback addresses, a free port and a short peer timeout."""
    data = load(repo / f"examples/spark-pair/{name}.toml").model_dump(mode="json", exclude_none=True)
    address, peer = ("127.0.0.1", "127.0.0.2") if name == "head" else ("127.0.0.2", "127.0.0.1")
    data["fabric"] |= {
        "address": address,
        "peer": peer,
        "rendezvous_port": rendezvous,
        "peer_timeout_s": PEER_TIMEOUT_S,
        "heartbeat_s": 0.3,
    }
    data["engine"] |= {"port": port, "context": 4096, "max_tokens": 1024}
    data["engine"]["tensorfold"] |= {"stop_timeout_s": 5, "env": {"FAKE_TENSORFOLD_RENDEZVOUS": "1"}}
    data["paths"] = {"state_dir": str(tmp_path / name / "state"), "cache_dir": str(tmp_path / name / "cache")}
    path = tmp_path / f"{name}.toml"
    path.write_text(tomli_w.dumps(data))
    return path


def start(config: Path, tmp_path: Path, name: str, engines: list[EngineProcess]) -> EngineProcess:
    docker_dir = tmp_path / name / "docker"
    docker_dir.mkdir(parents=True)
    (tmp_path / name / "run").mkdir()
    env = {
        "PATH": f"{FAKES}:{Path(sys.executable).parent}:{os.environ['PATH']}",
        "FAKE_DOCKER_DIR": str(docker_dir),
        "RUNTIME_DIRECTORY": str(tmp_path / name / "run"),  # as systemd gives the engine unit
    }
    proc = EngineProcess(config, tmp_path / f"{name}.log", env=env)
    engines.append(proc)
    return proc


def test_the_pair_serves_then_a_stopped_worker_takes_the_head_down(
    repo: Path, tmp_path: Path, engines: list[EngineProcess]
) -> None:
    port, rendezvous = free_port(), free_port()
    worker = start(pair_config(repo, tmp_path, "worker", port, rendezvous), tmp_path, "worker", engines)
    head = start(pair_config(repo, tmp_path, "head", port, rendezvous), tmp_path, "head", engines)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, head, DEADLINE_S)

    results = conformance(url, timeout_s=10)
    assert all(r.passed for r in results if r.required), [r for r in results if not r.passed]
    recorded = (tmp_path / "worker" / "docker" / "calls.jsonl").read_text()
    assert "--rank" in recorded and "--master" in recorded
    # the head records its peer watch for the gateway's /health (TensorFold's own has no peer block)
    record = tmp_path / "head" / "run" / "peer.json"
    end = time.monotonic() + DEADLINE_S  # written once the supervisor has seen the rank ready
    while not record.exists() and time.monotonic() < end and head.proc.poll() is None:
        time.sleep(0.1)
    peer = json.loads(record.read_text())
    assert peer["rank"] == 1 and peer["state"] == "ok" and peer["last_seen_s"] < PEER_TIMEOUT_S
    assert not (tmp_path / "worker" / "run" / "peer.json").exists(), "only the head runs a gateway"

    # SIGTERM: the worker stops its rank (docker stop) and exits 0
    worker.signal(signal.SIGTERM)
    assert worker.wait_exit(DEADLINE_S) == 0, worker.output()[-2000:]
    assert '"stop"' in (tmp_path / "worker" / "docker" / "calls.jsonl").read_text()

    # the head hears no more heartbeats: it stops its rank and exits non-zero for systemd to restart
    code = head.wait_exit(DEADLINE_S)
    assert code not in (None, 0), head.output()[-2000:]
    assert "stopping the local rank" in head.output()


def test_dry_run_prints_the_rank_1_docker_command(repo: Path) -> None:
    from click.testing import CliRunner

    from sparkfold.cli import main

    result = CliRunner().invoke(
        main, ["engine", "--config", str(repo / "examples/spark-pair/worker.toml"), "--dry-run"]
    )
    assert result.exit_code == 0, result.output
    argv_line = next(line for line in result.output.splitlines() if line.startswith("argv"))
    assert "docker run" in argv_line and "--rank 1 --master 203.0.113.1" in argv_line
    assert "NCCL_IB_GID_INDEX=3" in result.output


@pytest.fixture(autouse=True)
def _loopback_alias_exists() -> None:
    # 127.0.0.2 answers on Linux without configuration; say so clearly where it does not
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.bind(("127.0.0.2", 0))
        except OSError:
            pytest.skip("127.0.0.2 is not a loopback address on this host")
