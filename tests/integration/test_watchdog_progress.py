"""The tensorfold rank feeds systemd's watchdog only while it makes progress: a real ``sparkfold
engine`` (rank 0, tp 1) running the TensorFold stand-in, under a notify socket this test reads the
way systemd would. Wedged (``/health`` still ok, no request answered), the rank stops feeding the
watchdog and says why; unwedged, it feeds it again."""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import tomli_w
from engine_procs import EngineProcess, free_port, wait_healthy

from sparkfold.config import load

FAKES = Path(__file__).resolve().parents[1] / "fakes"
DEADLINE_S = 60.0


class NotifySocket:
    """A systemd-style notify socket: datagrams of ``KEY=value`` lines, read one at a time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.seen: list[str] = []

    def wait_for(self, wanted: str, deadline_s: float = DEADLINE_S) -> list[str]:
        """Read until a message holds ``wanted`` (bounded); the messages read on the way, it last."""
        read: list[str] = []
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            self.sock.settimeout(max(0.1, end - time.monotonic()))
            try:
                message = self.sock.recv(4096).decode()
            except TimeoutError:
                break
            read.append(message)
            if wanted in message:
                self.seen += read
                return read
        pytest.fail(f"no {wanted!r} from the rank within {deadline_s} s; got {read[-5:]}")

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def notify_socket(tmp_path: Path) -> Iterator[NotifySocket]:
    sock = NotifySocket(tmp_path / "notify")
    yield sock
    sock.close()


def head_config(repo: Path, tmp_path: Path, port: int) -> Path:
    data = load(repo / "examples/spark-pair/head.toml").model_dump(mode="json", exclude_none=True)
    data["engine"] |= {"tp": 1, "port": port, "context": 4096, "max_tokens": 1024, "stall_s": 30}
    data["engine"]["tensorfold"] |= {"stop_timeout_s": 5, "probe_every_s": 0.5}
    data["paths"] = {"state_dir": str(tmp_path / "state"), "cache_dir": str(tmp_path / "cache")}
    path = tmp_path / "head.toml"
    path.write_text(tomli_w.dumps(data))
    return path


def test_a_wedged_rank_stops_feeding_the_watchdog_and_resumes_once_it_answers(
    repo: Path, tmp_path: Path, engines: list[EngineProcess], notify_socket: NotifySocket
) -> None:
    port = free_port()
    (tmp_path / "docker").mkdir()
    env = {
        "PATH": f"{FAKES}:{Path(sys.executable).parent}:{os.environ['PATH']}",
        "FAKE_DOCKER_DIR": str(tmp_path / "docker"),
        "NOTIFY_SOCKET": str(notify_socket.path),
        "WATCHDOG_USEC": "1000000",  # WatchdogSec=1: a check every 0.5 s
    }
    rank = EngineProcess(head_config(repo, tmp_path, port), tmp_path / "head.log", env=env)
    engines.append(rank)
    url = f"http://127.0.0.1:{port}"
    wait_healthy(url, rank, DEADLINE_S)
    notify_socket.wait_for("READY=1")
    notify_socket.wait_for("WATCHDOG=1")  # idle and answering its probes: fed

    assert httpx.post(f"{url}/fake/wedge", timeout=5).json() == {"wedged": True}
    assert httpx.get(f"{url}/health", timeout=5).json()["ok"] is True  # "process alive" would pass
    read = notify_socket.wait_for("STATUS=no progress: the 1-token probe got no answer")
    assert "makes no progress" in rank.output()
    # From the first "no progress" on, nothing but status lines until the engine answers again.
    assert httpx.post(f"{url}/fake/unwedge", timeout=5).json() == {"wedged": False}
    resumed = notify_socket.wait_for("WATCHDOG=1")
    assert all("WATCHDOG=1" not in message for message in resumed[:-1]), resumed
    assert any("STATUS=rank 0 ready" in message for message in resumed), resumed
    assert read[-1].startswith("STATUS=no progress")
