"""The engine core: the model and its engine thread in a process of their own (``[engine] core_process``).

``python -m sparkfold.engines.core.main FD`` is started by
:class:`~sparkfold.engines.core.client.CoreClient`; ``FD`` is its end of a socket pair. It
loads the generator the settings name (:func:`~sparkfold.engines.startup.load_engine`, the same
loader and the same errors as an engine in the server's process), answers ``ready`` (or
``failed``), then runs without an event loop: this thread reads requests and cancels and puts
them on the engine's inbox (``ThreadedEngine.submit``), the engine thread steps, and at the end
of each step :class:`StepWriter` sends every stream's new tokens in ONE message
(:mod:`~sparkfold.engines.core.wire`). A status thread sends the health snapshot. This thread
also answers ``measure`` (exllamav3's pictures: the vision tower's patch grid of each).

It ignores SIGINT and SIGTERM (the server drains first, then sends ``close``), and it exits when
the server goes: the connection reaching its end, or the kernel's parent-death signal while it
still loads.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import signal
import sys
import threading
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from sparkfold.engines.core import wire as core_wire
from sparkfold.engines.generator import Generator, Outbox, SamplingParams

__all__ = ["StepWriter", "main"]

log = logging.getLogger("sparkfold.engine.core")
PR_SET_PDEATHSIG = 1


@dataclass
class _Stream:
    params: SamplingParams
    cancel: threading.Event
    logprobs_sent: int = 0


class StepWriter(Outbox):
    """An :class:`~sparkfold.engines.generator.Outbox` whose :meth:`flush` sends what the engine
    thread emitted in a step as one ``step`` message (instead of waking this process's event loops).

    Outside a step (a refusal at admission, the end of everything at shutdown) an item goes at once.
    """

    def __init__(self, conn: Connection, lock: threading.Lock) -> None:
        super().__init__()
        self._conn = conn
        self._lock = lock
        self.streams: dict[int, _Stream] = {}
        self._pending: dict[int, tuple[list[int], Any]] = {}
        self._pending_lock = threading.Lock()  # the engine thread's step and another thread's refusal

    def emit(self, rid: int, item: int | BaseException | None) -> None:
        with self._pending_lock:
            tokens, _ = entry = self._pending.get(rid) or ([], None)
            if isinstance(item, int):
                tokens.append(item)
            else:
                entry = (tokens, ("done",) if item is None else ("error", core_wire.portable_error(item)))
            self._pending[rid] = entry
        if not self.holding():
            self.flush()

    def flush(self) -> None:
        super().flush()  # what was sent to an event loop of this process (nothing, in a core)
        with self._pending_lock:
            pending, self._pending = self._pending, {}
            out = []
            for rid, (tokens, end) in pending.items():
                stream = self.streams.get(rid)
                if stream is None:
                    continue
                logprobs = stream.params.logprobs_out[stream.logprobs_sent :]
                stream.logprobs_sent += len(logprobs)
                out.append(core_wire.StreamStep(rid, tokens, logprobs, stream.params.report, end))
                if end is not None:
                    del self.streams[rid]
        if out:
            with self._lock:
                core_wire.send(self._conn, core_wire.Step(out))


def _status(generator: Generator) -> dict[str, Any]:
    return {
        "healthy": bool(generator.healthy()),
        "stalled_s": float(generator.stalled_s() or 0.0),
        "pool": generator.pool_stats(),
        "metrics": generator.metrics_text(),
    }


def _report_status(
    conn: Connection, lock: threading.Lock, generator: Generator, stop: threading.Event
) -> None:
    while not stop.wait(core_wire.STATUS_S):
        try:
            snapshot = _status(generator)
            with lock:
                core_wire.send(conn, core_wire.Status(snapshot))
        except OSError:
            return


def _pictures(generator: Generator) -> Any:
    """The exllamav3 engine's picture measurer (its vision tower's preprocessing), or ``None``."""
    from sparkfold.engines.exllamav3.vision import VisionPreprocessor

    processor = generator.glm.image_processor if generator.glm is not None else None
    return processor if isinstance(processor, VisionPreprocessor) else None


def _measure(pictures: Any, images: list[Any]) -> list[list[int]] | BaseException:
    if pictures is None:
        return ValueError("this engine core has no vision tower")
    try:
        grids: list[list[int]] = pictures.grids(images)
    except Exception as exc:  # a picture the vision tower cannot read: that request's 400
        log.warning("pictures refused: %s", exc)
        return core_wire.portable_error(exc)
    return grids


def _ready_info(generator: Generator) -> dict[str, Any]:
    pictures = _pictures(generator)
    return {
        "backend": generator.backend,
        "context_length": generator.context_length,
        "parallel": generator.parallel,
        "eos_token_ids": frozenset(generator.eos_token_ids),
        "vocab_size": generator.vocab_size,
        "tp": generator.tp,
        "supports_logprobs": generator.supports_logprobs,
        "glm": generator.glm is not None,
        "pictures_merge_size": pictures.merge_size if pictures is not None else None,
        "pictures_temporal_patch_size": pictures.temporal_patch_size if pictures is not None else None,
        "pid": os.getpid(),
        "status": _status(generator),
        "start_phases": dict(generator.start_phases),
    }


def _die(message: str) -> None:
    log.critical("%s", message)
    for handler in logging.getLogger().handlers:
        handler.flush()
    os._exit(1)


def serve(conn: Connection, generator: Any) -> None:
    """Requests in, step messages out, until ``close`` or the server is gone."""
    from sparkfold.glm.grammar import MatcherFactory

    lock = threading.Lock()
    writer = StepWriter(conn, lock)
    generator.use_outbox(writer)
    matchers = MatcherFactory(generator.tokenizer)
    pictures = _pictures(generator)
    stop = threading.Event()
    status = threading.Thread(
        target=_report_status, args=(conn, lock, generator, stop), name="core-status", daemon=True
    )
    status.start()
    try:
        while True:
            try:
                message = core_wire.recv(conn, matchers)
            except (EOFError, OSError):
                log.info("the engine server is gone; the core stops")
                break
            match message:
                case core_wire.Submit(rid, prompt, params):
                    cancel = threading.Event()
                    writer.streams[rid] = _Stream(params, cancel)
                    generator.submit(prompt, params, cancel, functools.partial(writer.emit, rid))
                case core_wire.Cancel(rid):
                    stream = writer.streams.get(rid)
                    if stream is not None:
                        stream.cancel.set()
                case core_wire.Measure(mid, images):  # here, not on the engine thread: it only reads
                    answer = _measure(pictures, images)
                    with lock:
                        core_wire.send(conn, core_wire.Measured(mid, answer))
                case core_wire.Close():
                    break
    finally:
        stop.set()
        generator.close()


def main(argv: list[str] | None = None) -> int:
    from sparkfold.config import EngineSettings
    from sparkfold.engines.startup import EngineUnavailable, RankError, load_engine

    args = sys.argv[1:] if argv is None else argv
    conn = Connection(int(args[0]))
    parent = os.getppid()
    if sys.platform == "linux":  # the server SIGKILLed while this still loads: go too
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:
            return 1
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_IGN)  # the server drains, then closes this
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s sparkfold-engine[core] %(levelname)s %(message)s",
    )
    try:
        message = core_wire.recv(conn)
    except (EOFError, OSError):
        return 1
    if not isinstance(message, core_wire.Start):
        return 1
    settings = EngineSettings.model_validate_json(message.settings_json)
    try:
        generator = load_engine(settings, _die)
    except RankError as exc:
        core_wire.send(conn, core_wire.Failed(isinstance(exc, EngineUnavailable), str(exc)))
        return 1
    except Exception as exc:
        log.exception("the engine core could not load")
        core_wire.send(conn, core_wire.Failed(False, f"the engine could not load: {exc}"))
        return 1
    generator.stall_s = settings.stall_s
    core_wire.send(conn, core_wire.Ready(_ready_info(generator)))
    serve(conn, generator)
    return 0


if __name__ == "__main__":
    sys.exit(main())
