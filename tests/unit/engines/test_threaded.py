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
from sparkfold.engines.service import EngineService
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


def test_a_step_reaches_the_event_loop_in_one_hand_over() -> None:
    """Three streams on one event loop: each step's tokens (and a reply's end) arrive in ONE
    ``call_soon_threadsafe``, not one per token; every stream still gets all its tokens in order."""
    engine = Held(parallel=3)
    wakeups = 0

    async def reply(prompt: int) -> list[int]:
        return [t async for t in engine.generate([prompt], SamplingParams(max_tokens=5), threading.Event())]

    async def scenario() -> list[list[int]]:
        loop = asyncio.get_running_loop()
        plain = loop.call_soon_threadsafe

        def counted(*args: Any, **kwargs: Any) -> Any:
            nonlocal wakeups
            wakeups += threading.current_thread() is engine._thread
            return plain(*args, **kwargs)

        engine.hold.set()  # the first step waits until all three requests are in
        tasks = [asyncio.create_task(reply(p)) for p in (1, 2, 3)]
        await asyncio.to_thread(engine.inside.wait, 10)
        await asyncio.to_thread(until, lambda: len(engine._active) + engine._inbox.qsize() == 3)
        loop.call_soon_threadsafe = counted  # type: ignore[method-assign]
        engine.hold.clear()
        engine.resume.set()
        return await asyncio.wait_for(asyncio.gather(*tasks), 10)

    try:
        assert asyncio.run(scenario()) == [[65] * 5] * 3
        assert wakeups == engine.steps_total  # 5 or 6 steps, not 15 tokens + 3 ends
    finally:
        engine.resume.set()
        engine.close()


def test_an_outbox_whose_event_loop_is_gone_cancels_what_it_held() -> None:
    from sparkfold.engines.generator import Outbox

    outbox = Outbox()
    loop = asyncio.new_event_loop()
    loop.close()
    cancels = [threading.Event(), threading.Event()]
    got: list[int] = []
    with pytest.raises(ValueError, match="the step failed"), outbox.step():
        for n, cancel in enumerate(cancels):
            outbox.send(loop, got.append, n, cancel)
        raise ValueError("the step failed")  # held items are handed over (here: refused) anyway
    assert got == [] and all(cancel.is_set() for cancel in cancels)


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
