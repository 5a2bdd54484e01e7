"""The scheduling loop both our engines share (``ThreadedEngine``), on a model that can be held.

:class:`Held` gives each running job one token per step and, while ``hold`` is set, blocks the
engine thread inside its step, so a test can line up exactly what waits when the step ends.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sparkfold.engines.generator import CapacityError, SamplingParams
from sparkfold.engines.serving import EngineService
from sparkfold.engines.threaded import Job, ThreadedEngine


class Tok:
    chat_template = None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(i) for i in ids)


@dataclass(eq=False)
class _Job(Job):
    produced: int = 0


class Held(ThreadedEngine[_Job]):
    backend = "held"
    job_type = _Job
    context_length = 1024
    eos_token_ids = frozenset({0})
    vocab_size = 128

    def __init__(self, parallel: int = 1, stall_s: float = 300.0) -> None:
        self.parallel = parallel
        self.stall_s = stall_s
        self.idle_wait_s = 0.05
        self.hold = threading.Event()
        self.resume = threading.Event()
        self.inside = threading.Event()
        """Set while the engine thread is held inside a step."""
        self._start(Tok())

    def _begin(self, job: _Job) -> BaseException | None:
        return None

    def _step(self) -> None:
        if self.hold.is_set():
            self.inside.set()
            self.resume.wait(timeout=30)
            self.inside.clear()
        for job in list(self._active):
            job.produced += 1
            job.emit(65)
            if job.produced >= job.params.max_tokens:
                self._end(job, None)


def until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


async def first(tokens: AsyncIterator[int]) -> int | BaseException:
    try:
        return await anext(tokens)
    except Exception as exc:
        return exc


def test_a_job_whose_client_left_is_reaped_before_the_next_is_admitted() -> None:
    """The gateway hands a lane on the moment its client leaves; the next request must find it free."""
    engine = Held(parallel=1)

    async def scenario() -> int | BaseException:
        params = SamplingParams(max_tokens=10_000)
        leaving = engine.generate([1], params, threading.Event())
        assert await anext(leaving) == 65
        engine.hold.set()
        await asyncio.to_thread(engine.inside.wait, 10)  # the engine thread is inside a step
        await leaving.aclose()  # its client left (cancel set) ...
        arriving = asyncio.create_task(
            first(engine.generate([2], SamplingParams(max_tokens=1), threading.Event()))
        )
        await asyncio.to_thread(until, lambda: engine._inbox.qsize() == 1)  # ... and the next one came
        engine.hold.clear()
        engine.resume.set()
        return await asyncio.wait_for(arriving, 10)

    try:
        assert asyncio.run(scenario()) == 65
    finally:
        engine.resume.set()
        engine.close()


def test_past_parallel_a_request_is_refused_alone() -> None:
    engine = Held(parallel=1)

    async def scenario() -> int | BaseException:
        running = engine.generate([1], SamplingParams(max_tokens=10_000), threading.Event())
        assert await anext(running) == 65
        refused = await first(engine.generate([2], SamplingParams(max_tokens=1), threading.Event()))
        await running.aclose()
        return refused

    try:
        assert isinstance(asyncio.run(scenario()), CapacityError)
    finally:
        engine.close()


@pytest.fixture
def watchdog(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(str(tmp_path / "notify.sock"))
    server.setblocking(False)
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "notify.sock"))
    yield server
    server.close()


def test_a_wedged_engine_is_unhealthy_and_the_watchdog_stops(watchdog: socket.socket) -> None:
    from sparkfold.node.supervisor import feed_watchdog

    engine = Held(parallel=1, stall_s=0.2)
    service = EngineService(engine, served_name="held", max_tokens=8)  # type: ignore[arg-type]
    try:
        assert feed_watchdog(service) and watchdog.recv(64) == b"WATCHDOG=1"
        engine.hold.set()  # the next step never ends: the thread lives, nothing progresses

        async def wedge() -> None:
            tokens = engine.generate([1], SamplingParams(max_tokens=10_000), threading.Event())
            await anext(tokens)
            await asyncio.to_thread(engine.inside.wait, 10)
            await asyncio.to_thread(until, lambda: not engine.healthy())
            health = service.health()
            assert not health.ok and (health.stalled_s or 0) >= 0.2
            assert not feed_watchdog(service)
            with pytest.raises(BlockingIOError):
                watchdog.recv(64)  # nothing was sent
            engine.hold.clear()
            engine.resume.set()  # progress again: healthy again
            await asyncio.to_thread(until, engine.healthy)
            await tokens.aclose()

        asyncio.run(wedge())
        assert feed_watchdog(service) and watchdog.recv(64) == b"WATCHDOG=1"
    finally:
        engine.resume.set()
        engine.close()
