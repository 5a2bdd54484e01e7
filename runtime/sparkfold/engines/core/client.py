"""The engine server's side of an engine core (``[engine] core_process = true``).

:class:`CoreClient` is a :class:`~sparkfold.engines.generator.Generator` whose model runs in a
child process (:mod:`sparkfold.engines.core.main`): the HTTP side (uvicorn, the tokenizer, the
chat template, the GLM parser, SSE) no longer shares an interpreter, and its GIL, with the
engine thread. This is the split vLLM made for the same reason: its V1 engine core runs the
scheduler and model in a process of its own and exchanges one batch of outputs per step with
the API server (https://blog.vllm.ai/2025/01/27/v1-alpha-release.html, "Optimized execution
loop & API server"; https://docs.vllm.ai/en/latest/design/arch_overview.html). Written by hand
rather than taken from vLLM (its engine core is bound to its own scheduler and request types)
or over ZeroMQ (a new dependency for one point-to-point pipe between two processes of one
host): a ``multiprocessing`` connection over a socket pair, messages in
:mod:`~sparkfold.engines.core.wire`.

Here: the tokenizer and GLM protocol are loaded locally (the same Hugging Face files);
``generate`` sends the request and reads its tokens from a per-request asyncio queue that one
reader thread fills, one event-loop wake-up per engine step; ``/health``'s ok, ``stalled_s``,
``pool`` and the metrics text come from the core's status snapshot. The core gone (killed,
crashed): ``healthy()`` is false and every request in flight or new fails with
:class:`~sparkfold.engines.generator.EngineGone` (HTTP 503 ``engine_unavailable``; a stream ends
with that error event). The server gone: the core reads the end of the connection and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import fields
from multiprocessing.connection import Connection
from typing import Any

from sparkfold.config import EngineSettings
from sparkfold.engines.core import wire as core_wire
from sparkfold.engines.generator import EngineGone, GenerationReport, SamplingParams
from sparkfold.engines.threaded import HfTokenizer

__all__ = ["CoreClient"]

log = logging.getLogger("sparkfold.engine")
CLOSE_WAIT_S = 60.0
"""How long ``close`` waits for the core to end its requests and exit before it is killed."""
MEASURE_WAIT_S = 60.0
"""How long a request's pictures wait for the core's vision tower to measure them."""

_Item = tuple[list[int], list[Any], GenerationReport | None, Any]


class _Answer:
    """The core's answer to one ``measure``, awaited by the request's thread."""

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.value: Any = None


class CoreClient(HfTokenizer):
    """A Generator whose engine runs in the engine core process."""

    def __init__(self, conn: Connection, process: subprocess.Popen[bytes], info: dict[str, Any]) -> None:
        self._conn = conn
        self._process = process
        self.backend: str = info["backend"]
        self.context_length: int = info["context_length"]
        self.parallel: int = info["parallel"]
        self.eos_token_ids: frozenset[int] = info["eos_token_ids"]
        self.vocab_size: int = info["vocab_size"]
        self.tp: int = info["tp"]
        self.start_phases = info.get("start_phases") or {}
        """The core's load and warm-up seconds (``sparkfold.engines.startup.load_engine``)."""
        self.supports_logprobs: bool = info["supports_logprobs"]
        self.pictures_merge_size: int | None = info.get("pictures_merge_size")
        """Set when the core's engine has a vision tower (exllamav3): :meth:`measure_pictures` works."""
        self.pictures_temporal_patch_size: int = info.get("pictures_temporal_patch_size") or 2
        """Frames per temporal group of that tower (a clip's groups in the prompt)."""
        self.glm: Any = None
        self._status: dict[str, Any] = info["status"]
        self._status_at = time.monotonic()
        self._send_lock = threading.Lock()
        self._ids = itertools.count()
        self._streams: dict[int, tuple[asyncio.AbstractEventLoop, asyncio.Queue[_Item]]] = {}
        self._answers: dict[int, _Answer] = {}
        self._gone: str | None = None
        self._reader = threading.Thread(target=self._read, name="core-reader", daemon=True)

    @classmethod
    def start(cls, settings: EngineSettings) -> CoreClient:
        """Start the core, load the tokenizer side here meanwhile, and wait for the core's ``ready``.

        A load error in the core is raised here as the same :class:`~sparkfold.engines.startup.RankError`
        (or ``EngineUnavailable``) an engine in this process would raise.
        """
        from sparkfold.engines.startup import EngineUnavailable, RankError

        ours, theirs = socket.socketpair()
        process = subprocess.Popen(
            [sys.executable, "-m", "sparkfold.engines.core.main", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
        )
        theirs.close()
        conn = Connection(ours.detach())
        log.info("the engine core (pid %d) is loading %s", process.pid, settings.model)
        core_wire.send(conn, core_wire.Start(settings.model_dump_json()))
        try:
            message = core_wire.recv(conn)
        except (EOFError, OSError):
            code = process.wait()
            conn.close()
            raise RankError(
                f"the engine core exited with code {code} while loading; its log is above"
            ) from None
        if not isinstance(message, core_wire.Ready):
            process.wait()
            conn.close()
            if isinstance(message, core_wire.Failed):
                raise (EngineUnavailable if message.unavailable else RankError)(message.message)
            raise RankError(f"the engine core answered {type(message).__name__} instead of ready")
        client = cls(conn, process, message.info)
        client.stall_s = settings.stall_s
        client._load_server_side(settings)
        client._reader.start()
        log.info("the engine core (pid %d) is ready", process.pid)
        return client

    def _load_server_side(self, settings: EngineSettings) -> None:
        if settings.kind == "exllamav3":
            from sparkfold.engines.exllamav3.loading import server_side

            tokenizer, glm = server_side(settings, self.vocab_size, self.picture_processor())
        else:
            from sparkfold.engines.transformers.backend import server_side as transformers_server_side

            tokenizer, glm = transformers_server_side(settings)
        self._adopt(tokenizer)
        self.glm = glm

    def picture_processor(self) -> Any:
        """What measures pictures for the prompt on this side: the core's vision tower, asked over the
        pipe (:meth:`measure_pictures`); ``None`` when the core's engine has none."""
        if self.pictures_merge_size is None:
            return None
        import torch

        from sparkfold.engines.exllamav3.vision import RemoteVisionPreprocessor

        return RemoteVisionPreprocessor(
            self.measure_pictures, self.pictures_merge_size, torch, self.pictures_temporal_patch_size
        )

    def measure_pictures(self, images: Sequence[Any]) -> list[list[int]]:
        """Each picture's patch grid, from the core's vision tower (a request thread waits for it).

        Raises :class:`~sparkfold.glm.errors.MediaError` (400) for a picture it cannot read and
        :class:`~sparkfold.engines.generator.EngineGone` when the core is gone.
        """
        from sparkfold.glm.errors import MediaError

        mid = next(self._ids)
        answer = self._answers[mid] = _Answer()
        try:
            if self._gone is not None:
                raise EngineGone(self._gone)
            self._send(core_wire.Measure(mid, list(images)))
            if not answer.ready.wait(MEASURE_WAIT_S):
                raise EngineGone(f"the engine core did not measure the pictures within {MEASURE_WAIT_S:g} s")
        finally:
            self._answers.pop(mid, None)
        if isinstance(answer.value, EngineGone):
            raise answer.value
        if isinstance(answer.value, BaseException):
            raise MediaError(f"the pictures could not be read: {answer.value}", param="messages")
        return answer.value  # type: ignore[no-any-return]

    @property
    def pid(self) -> int:
        """The engine core's process id."""
        return self._process.pid

    # --- generation -----------------------------------------------------------------------------

    def _send(self, message: core_wire.ToCore) -> None:
        try:
            with self._send_lock:
                core_wire.send(self._conn, message)
        except OSError:
            raise EngineGone(self._gone or "the engine core is gone; the engine is unavailable") from None

    async def generate(
        self, prompt_ids: Sequence[int], params: SamplingParams, cancel: threading.Event
    ) -> AsyncIterator[int]:
        if self._gone is not None:
            raise EngineGone(self._gone)
        rid = next(self._ids)
        items: asyncio.Queue[_Item] = asyncio.Queue()
        self._streams[rid] = (asyncio.get_running_loop(), items)
        ended = False
        try:
            self._send(core_wire.Submit(rid, list(prompt_ids), params))
            while True:
                tokens, logprobs, report, end = await items.get()
                if report is not None:
                    for name in fields(report):
                        setattr(params.report, name.name, getattr(report, name.name))
                params.logprobs_out.extend(logprobs)
                for token in tokens:
                    yield token
                if end is not None:
                    ended = True
                    if end[0] == "error":
                        raise end[1]
                    return
        finally:
            self._streams.pop(rid, None)
            cancel.set()
            if not ended and self._gone is None:
                with contextlib.suppress(EngineGone):
                    self._send(core_wire.Cancel(rid))

    def _read(self) -> None:
        """The reader thread: each step message to the event loops of its streams, one call per loop."""
        while True:
            try:
                message = core_wire.recv(self._conn)
            except (EOFError, OSError):
                break
            if isinstance(message, core_wire.Status):
                self._status, self._status_at = message.snapshot, time.monotonic()
                continue
            if isinstance(message, core_wire.Measured):
                self._answer(message.id, message.answer)
                continue
            if not isinstance(message, core_wire.Step):
                log.error("the engine core sent %s out of turn; ignored", type(message).__name__)
                continue
            by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue[_Item], _Item]]] = {}
            for rid, tokens, logprobs, report, end in message.streams:
                stream = self._streams.get(rid)
                if stream is not None:
                    by_loop.setdefault(stream[0], []).append((stream[1], (tokens, logprobs, report, end)))
            for loop, items in by_loop.items():
                with contextlib.suppress(RuntimeError):  # that event loop is gone
                    loop.call_soon_threadsafe(_deliver, items)
        try:
            code: int | None = self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        self._gone = (
            f"the engine core (pid {self._process.pid}) exited"
            + (f" with code {code}" if code is not None else "")
            + "; the engine is unavailable until it restarts"
        )
        log.error("%s", self._gone)
        failure = ("error", EngineGone(self._gone))
        for loop, queue in list(self._streams.values()):
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(queue.put_nowait, ([], [], None, failure))
        for mid in list(self._answers):
            self._answer(mid, failure[1])

    def _answer(self, mid: int, value: Any) -> None:
        answer = self._answers.get(mid)
        if answer is not None:
            answer.value = value
            answer.ready.set()

    # --- status ---------------------------------------------------------------------------------

    def healthy(self) -> bool:
        fresh = time.monotonic() - self._status_at < self.stall_s
        return self._gone is None and fresh and bool(self._status["healthy"])

    def stalled_s(self) -> float:
        return float(self._status["stalled_s"])

    def pool_stats(self) -> dict[str, int] | None:
        return self._status["pool"]  # type: ignore[no-any-return]

    def metrics_text(self) -> str:
        return self._status["metrics"] or ""

    def close(self) -> None:
        """Ask the core to end what runs and exit; kill it if it does not within :data:`CLOSE_WAIT_S`."""
        with contextlib.suppress(EngineGone):
            self._send(core_wire.Close())
        try:
            self._process.wait(timeout=CLOSE_WAIT_S)
        except subprocess.TimeoutExpired:
            log.error("the engine core (pid %d) did not exit; killing it", self._process.pid)
            self._process.kill()
            self._process.wait(timeout=CLOSE_WAIT_S)
        self._reader.join(timeout=CLOSE_WAIT_S)
        self._conn.close()


def _deliver(items: list[tuple[asyncio.Queue[_Item], _Item]]) -> None:
    for queue, item in items:
        queue.put_nowait(item)


if os.name != "posix":  # pragma: no cover - pass_fds and socket pairs of this kind are POSIX
    raise ImportError("the engine core needs a POSIX system")
