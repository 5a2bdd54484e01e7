"""RankProcess launches a rank through the fake docker, sees it ready, and stops it.

tests/fakes/docker records its argv and execs tests/fakes/fake_tensorfold.py, which follows
docs/engine-protocol.md with canned replies, so `sparkfold conformance` runs against it for real
(loopback, a free port).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sparkfold.config import Settings, load, parse
from sparkfold.conformance import run as conformance
from sparkfold.engines.tensorfold.launch import FabricFacts, launch_plan
from sparkfold.engines.tensorfold.process import RankProcess, RankStartError, image_key

FAKES = Path(__file__).resolve().parents[2] / "fakes"
DEADLINE_S = 30.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def docker_dir(tmp_path: Path) -> Path:
    path = tmp_path / "docker"
    path.mkdir()
    return path


@pytest.fixture
def env(docker_dir: Path) -> dict[str, str]:
    python_dir = str(Path(sys.executable).parent)
    return os.environ | {
        "PATH": f"{FAKES}:{python_dir}:{os.environ['PATH']}",
        "FAKE_DOCKER_DIR": str(docker_dir),
    }


def settings_for(repo: Path, tmp_path: Path, name: str, **tensorfold: Any) -> Settings:
    data = load(repo / f"examples/spark-pair/{name}.toml").model_dump(mode="json", exclude_none=True)
    data["engine"]["port"] = free_port()
    data["engine"]["context"] = 4096
    data["engine"]["max_tokens"] = 1024
    data["engine"]["tensorfold"] |= {"stop_timeout_s": 5, **tensorfold}
    data["paths"] = {"state_dir": str(tmp_path / "state"), "cache_dir": str(tmp_path / "cache")}
    return parse(data)


def calls(docker_dir: Path) -> list[list[str]]:
    lines = (docker_dir / "calls.jsonl").read_text().splitlines()
    return [json.loads(line)["argv"] for line in lines]


@pytest.fixture
def started() -> Iterator[list[RankProcess]]:
    ranks: list[RankProcess] = []
    yield ranks
    for rank in ranks:
        rank.stop(timeout_s=1)


def launch(settings: Settings, env: dict[str, str], started: list[RankProcess]) -> RankProcess:
    rank = RankProcess(launch_plan(settings, FabricFacts.from_settings(settings.fabric)), base_env=env)
    started.append(rank)
    rank.start()
    return rank


def test_rank0_serves_a_conforming_api_then_stops(
    repo: Path, tmp_path: Path, env: dict[str, str], docker_dir: Path, started: list[RankProcess]
) -> None:
    settings = settings_for(repo, tmp_path, "head")
    rank = launch(settings, env, started)
    assert rank.port_open_at is None
    rank.wait_ready(DEADLINE_S, poll_s=0.05)
    assert rank.port_open_at is not None  # the engine port's first answer, for the serving marker
    assert rank.serving_url == settings.engine_url
    assert (tmp_path / "cache/tensorfold/sparkfold-tensorfold_v0.6.0").is_dir()  # kernel cache made
    assert any(line.startswith("[tensorfold] serving GLM-5.3-Flash-EXL3") for line in rank.tail)

    results = conformance(settings.engine_url, timeout_s=10)
    failed = [r for r in results if r.required and not r.passed]
    assert not failed, failed

    assert rank.stop() == 0
    assert rank.returncode == 0
    recorded = calls(docker_dir)
    assert recorded[0] == ["rm", "-f", "sparkfold-engine"]  # a leftover is cleared first
    assert recorded[1] == list(rank.plan.argv[1:])  # exactly the planned docker run
    assert recorded[2] == ["stop", "-t", "5", "sparkfold-engine"]


def test_conformance_fails_a_broken_rank0(
    repo: Path, tmp_path: Path, env: dict[str, str], started: list[RankProcess]
) -> None:
    settings = settings_for(repo, tmp_path, "head", env={"FAKE_TENSORFOLD_BROKEN": "done"})
    rank = launch(settings, env, started)
    rank.wait_ready(DEADLINE_S, poll_s=0.05)
    verdicts = {r.name: r.passed for r in conformance(settings.engine_url, timeout_s=10)}
    assert verdicts["chat_stream"] is False
    assert verdicts["chat_completion"] is True


def test_rank1_is_ready_at_its_line(
    repo: Path, tmp_path: Path, env: dict[str, str], started: list[RankProcess]
) -> None:
    lines: list[str] = []
    settings = settings_for(repo, tmp_path, "worker")
    plan = launch_plan(settings, FabricFacts.from_settings(settings.fabric))
    rank = RankProcess(plan, base_env=env, on_line=lines.append)
    started.append(rank)
    rank.start()
    rank.wait_ready(DEADLINE_S, poll_s=0.05)
    assert any("rank 1 ready in" in line for line in lines)
    assert rank.port_open_at is None  # rank 1 has no port
    assert rank.returncode is None  # it follows rank 0 until stopped
    assert rank.stop() == 0


def test_progress_is_reported_while_loading(
    repo: Path, tmp_path: Path, env: dict[str, str], started: list[RankProcess]
) -> None:
    notes: list[str] = []
    settings = settings_for(repo, tmp_path, "worker", env={"FAKE_TENSORFOLD_LOAD_S": "0.5"})
    rank = launch(settings, env, started)
    rank.wait_ready(DEADLINE_S, progress=notes.append, progress_every_s=0.1, poll_s=0.05)
    assert notes and notes[0].startswith("rank 1: ")


def test_a_rank_that_refuses_to_start_is_reported_with_its_words(
    repo: Path, tmp_path: Path, env: dict[str, str], started: list[RankProcess]
) -> None:
    settings = settings_for(repo, tmp_path, "head", env={"FAKE_TENSORFOLD_FAIL": "context too large"})
    rank = launch(settings, env, started)
    with pytest.raises(
        RankStartError, match=r"rank 0 exited \(code 1\) before it was ready: tensorfold: context"
    ):
        rank.wait_ready(DEADLINE_S, poll_s=0.05)


def test_a_missing_image_is_reported(
    repo: Path, tmp_path: Path, env: dict[str, str], started: list[RankProcess]
) -> None:
    settings = settings_for(repo, tmp_path, "worker")
    rank = launch(settings, env | {"FAKE_DOCKER_NO_IMAGE": settings.engine.tensorfold.image}, started)
    with pytest.raises(RankStartError, match=r"code 125.*No such image: sparkfold-tensorfold:v0\.6\.0"):
        rank.wait_ready(DEADLINE_S, poll_s=0.05)


def test_not_ready_in_time_leaves_it_running(
    repo: Path, tmp_path: Path, env: dict[str, str], started: list[RankProcess]
) -> None:
    settings = settings_for(repo, tmp_path, "worker", env={"FAKE_TENSORFOLD_LOAD_S": "60"})
    rank = launch(settings, env, started)
    with pytest.raises(RankStartError, match=r"rank 1 not ready after \d+ s"):
        rank.wait_ready(0.2, poll_s=0.05)
    assert rank.returncode is None
    deadline = time.monotonic() + DEADLINE_S
    while not rank.tail and time.monotonic() < deadline:  # its first line: the SIGTERM handler is set
        time.sleep(0.05)
    assert rank.stop() == 0  # SIGTERM during loading exits cleanly


def test_host_launcher_runs_tensorfold_directly(
    repo: Path, tmp_path: Path, env: dict[str, str], docker_dir: Path, started: list[RankProcess]
) -> None:
    executable = str(FAKES / "fake_tensorfold.py")
    settings = settings_for(repo, tmp_path, "head", launcher="host", executable=executable)
    rank = launch(settings, env, started)
    rank.wait_ready(DEADLINE_S, poll_s=0.05)
    assert conformance(settings.engine_url, timeout_s=10)[0].passed  # health
    assert rank.stop() == 0
    assert not (docker_dir / "calls.jsonl").exists()  # no docker involved


def test_image_key_is_the_series_label(repo: Path, tmp_path: Path, env: dict[str, str]) -> None:
    settings = settings_for(repo, tmp_path, "head")
    label = "ab" * 32
    assert image_key(settings, env | {"FAKE_DOCKER_LABEL": label}) == "ab" * 6
    assert image_key(settings, env) is None  # no label: docker prints <no value>
    recipe = env | {"FAKE_DOCKER_LABEL": "<no value> a1897d591f70"}  # the recipe's published image
    assert image_key(settings, recipe) == "a1897d591f70"
    assert image_key(settings, env | {"FAKE_DOCKER_NO_IMAGE": settings.engine.tensorfold.image}) is None
    host = settings_for(repo, tmp_path, "head", launcher="host")
    assert image_key(host, env | {"FAKE_DOCKER_LABEL": label}) is None


def test_a_rank_that_ignores_sigterm_is_killed(
    repo: Path, tmp_path: Path, env: dict[str, str], started: list[RankProcess]
) -> None:
    executable = str(FAKES / "fake_tensorfold.py")
    settings = settings_for(
        repo,
        tmp_path,
        "worker",
        launcher="host",
        executable=executable,
        env={"FAKE_TENSORFOLD_IGNORE_TERM": "1"},
    )
    rank = launch(settings, env, started)
    rank.wait_ready(DEADLINE_S, poll_s=0.05)
    assert rank.stop(timeout_s=0.2) == -9


def test_a_pair_on_loopback_rendezvous_serves_and_rank1_exits_when_rank0_goes(
    repo: Path, tmp_path: Path, env: dict[str, str], started: list[RankProcess]
) -> None:
    # two "hosts": one fake docker state each; the link is loopback (127.0.0.1 <-> 127.0.0.2)
    port, rendezvous = free_port(), free_port()
    ranks = {}
    for name, address, peer in (("worker", "127.0.0.2", "127.0.0.1"), ("head", "127.0.0.1", "127.0.0.2")):
        data = settings_for(repo, tmp_path, name, env={"FAKE_TENSORFOLD_RENDEZVOUS": "1"}).model_dump(
            mode="json", exclude_none=True
        )
        data["engine"]["port"] = port
        data["fabric"] |= {"address": address, "peer": peer, "rendezvous_port": rendezvous}
        host_dir = tmp_path / name
        host_dir.mkdir()
        ranks[name] = launch(parse(data), env | {"FAKE_DOCKER_DIR": str(host_dir)}, started)
    worker, head = ranks["worker"], ranks["head"]
    worker.wait_ready(DEADLINE_S, poll_s=0.05)  # worker first, as the units start them
    head.wait_ready(DEADLINE_S, poll_s=0.05)
    assert "--master 127.0.0.1" in " ".join(worker.plan.command)
    results = conformance(f"http://127.0.0.1:{port}", timeout_s=10)
    assert all(r.passed for r in results if r.required)
    assert head.stop() == 0
    assert worker.wait(DEADLINE_S) == 1  # lost rank 0
    assert worker.tail[-1] == "tensorfold: lost rank 0 (rendezvous store connection closed)"
