"""Peer watch: UDP heartbeats between the two ranks on the fabric addresses.

Each rank sends a small datagram to the other every ``heartbeat_s`` (to ``rendezvous_port + 1``
on the peer's fabric address) and listens on its own. The channel is independent of the engine's
collectives, so it notices a dead peer or a dead link even while a gloo call hangs. When the
peer has been silent for ``peer_timeout_s`` the watch calls ``on_lost`` (the supervisor logs one
line and exits non-zero). A rank counts silence from its own start: a peer that never comes is
lost too, so neither rank waits forever.

A supervisor whose engine's ``/health`` carries no ``peer`` block (TensorFold) records the watch's
state as ``peer.json`` in the engine unit's runtime folder (:func:`record_peer`); the gateway on the
same node reads it (:func:`recorded_peer`) into its own ``/health``.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from pydantic import ValidationError

from sparkfold.config import Settings
from sparkfold.node.marker import read_record, write_record
from sparkfold.protocol import PeerState

__all__ = [
    "HEARTBEAT_PORT_OFFSET",
    "PEER_RECORD",
    "PeerWatch",
    "record_peer",
    "recorded_peer",
    "start_peer_watch",
]

log = logging.getLogger(__name__)

HEARTBEAT_PORT_OFFSET = 1
_MAGIC = b"sparkfold-heartbeat"
PEER_RECORD = "peer.json"


class PeerWatch:
    """Heartbeats to and from the peer rank; ``on_lost(message)`` once it falls silent."""

    def __init__(
        self,
        *,
        rank: int,
        address: str,
        peer: str,
        port: int,
        heartbeat_s: float,
        timeout_s: float,
        on_lost: Callable[[str], None],
    ) -> None:
        self.rank, self.peer, self.port = rank, peer, port
        self.heartbeat_s, self.timeout_s = heartbeat_s, timeout_s
        self._on_lost = on_lost
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((address, port))
        self._sock.settimeout(min(heartbeat_s, 0.5))
        self._started = time.monotonic()
        self._last_seen: float | None = None
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._send, name="peer-send", daemon=True),
            threading.Thread(target=self._watch, name="peer-watch", daemon=True),
        ]

    def start(self) -> PeerWatch:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def state(self) -> PeerState:
        """The ``peer`` block of ``/health``."""
        seen = self._last_seen
        since = time.monotonic() - (seen if seen is not None else self._started)
        lost = since > self.timeout_s
        return PeerState(
            rank=1 - self.rank,
            state="lost" if lost else "ok",
            last_seen_s=round(since, 3) if seen is not None else None,
        )

    def alive(self) -> bool:
        return self.state().state == "ok"

    def _send(self) -> None:
        message = _MAGIC + b" %d" % self.rank
        while not self._stop.is_set():
            # link down or no route: silence is what the other side measures
            with contextlib.suppress(OSError):
                self._sock.sendto(message, (self.peer, self.port))
            self._stop.wait(self.heartbeat_s)

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                data, (host, _) = self._sock.recvfrom(64)
            except TimeoutError:
                data, host = b"", ""
            except OSError:
                data, host = b"", ""
                self._stop.wait(0.2)
            if data.startswith(_MAGIC) and host == self.peer:
                self._last_seen = time.monotonic()
            reference = self._last_seen if self._last_seen is not None else self._started
            silent = time.monotonic() - reference
            if silent > self.timeout_s and not self._stop.is_set():
                what = "silent" if self._last_seen is not None else "never heard from"
                self._stop.set()
                self._on_lost(
                    f"peer rank {1 - self.rank} at {self.peer} {what} for {silent:.1f} s "
                    f"(fabric.peer_timeout_s = {self.timeout_s:g}); exiting"
                )


def start_peer_watch(settings: Settings, on_lost: Callable[[str], None]) -> PeerWatch | None:
    """The running watch for this node's rank, or None for a single-rank engine (``tp = 1``)."""
    if settings.engine.tp == 1:
        return None
    fabric = settings.fabric
    return PeerWatch(
        rank=settings.node.rank,
        address=str(fabric.address),
        peer=str(fabric.peer),
        port=fabric.rendezvous_port + HEARTBEAT_PORT_OFFSET,
        heartbeat_s=fabric.heartbeat_s,
        timeout_s=fabric.peer_timeout_s,
        on_lost=on_lost,
    ).start()


def record_peer(state: PeerState, env: Mapping[str, str] | None = None) -> Path | None:
    """Record the watch's state for the gateway (outside a systemd unit: nothing)."""
    return write_record(PEER_RECORD, state.model_dump(), env)


def recorded_peer(root: Path = Path("/")) -> PeerState | None:
    """The peer state this node's engine supervisor records, while it runs; else None."""
    data = read_record(PEER_RECORD, root)
    if data is None:
        return None
    try:
        return PeerState.model_validate({key: value for key, value in data.items() if key != "pid"})
    except ValidationError:
        return None
