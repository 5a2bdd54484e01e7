from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

from sparkfold.node.marker import RUN_DIR
from sparkfold.node.peer import PeerWatch, record_peer, recorded_peer
from sparkfold.protocol import PeerState


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _watch(rank: int, port: int, lost: list[str], event: threading.Event, timeout_s: float) -> PeerWatch:
    me, peer = ("127.0.0.1", "127.0.0.2") if rank == 0 else ("127.0.0.2", "127.0.0.1")

    def on_lost(message: str) -> None:
        lost.append(message)
        event.set()

    return PeerWatch(
        rank=rank, address=me, peer=peer, port=port, heartbeat_s=0.1, timeout_s=timeout_s, on_lost=on_lost
    )


def _wait_until(predicate: object, deadline_s: float) -> bool:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if predicate():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return False


def test_two_ranks_see_each_other_then_one_goes_silent() -> None:
    port = _free_udp_port()
    lost0: list[str] = []
    gone = threading.Event()
    rank0 = _watch(0, port, lost0, gone, timeout_s=1.0).start()
    rank1 = _watch(1, port, [], threading.Event(), timeout_s=30.0).start()
    try:
        assert _wait_until(lambda: rank0.state().last_seen_s is not None, 5)
        assert rank0.state().state == "ok" and rank0.state().rank == 1
        rank1.stop()
        assert gone.wait(10), "rank 0 never noticed the silence"
        assert "peer rank 1 at 127.0.0.2 silent" in lost0[0]
        assert rank0.state().state == "lost"
    finally:
        rank0.stop()
        rank1.stop()


def test_a_peer_that_never_comes_is_lost_too() -> None:
    lost: list[str] = []
    gone = threading.Event()
    watch = _watch(0, _free_udp_port(), lost, gone, timeout_s=0.5).start()
    try:
        assert gone.wait(10)
        assert "never heard from" in lost[0]
    finally:
        watch.stop()


def test_the_recorded_peer_state_reads_back_while_its_writer_runs(tmp_path: Path) -> None:
    folder = tmp_path / RUN_DIR
    folder.mkdir(parents=True)
    (tmp_path / "proc").mkdir()
    state = PeerState(rank=1, state="ok", last_seen_s=0.7)
    assert record_peer(state, {}) is None, "outside a unit nothing is written"
    written = record_peer(state, {"RUNTIME_DIRECTORY": str(folder)})
    assert written == folder / "peer.json"
    assert recorded_peer(tmp_path) is None, "its writer (this pid) is not in this root's /proc"
    (tmp_path / "proc" / str(os.getpid())).mkdir()
    assert recorded_peer(tmp_path) == state
    written.write_text("{not json")
    assert recorded_peer(tmp_path) is None
