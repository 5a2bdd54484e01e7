"""What the engine server and its engine core (``[engine] core_process``) send each other, and how.

Each message is one dataclass below, pickled onto a ``multiprocessing`` connection
(length-prefixed frames over a socket pair) by a pickler of our own for one reason: a
structured-output matcher (:class:`~sparkfold.glm.grammar.ConstrainedMatcher`) holds xgrammar
state that cannot be pickled, so it travels as its :class:`~sparkfold.glm.grammar.MatcherSpec`
and the core builds the same matcher with its :class:`~sparkfold.glm.grammar.MatcherFactory`.
Everything else (sampling parameters, picture tensors, reports, log-probabilities) is pickled by
value.

Server → core (:data:`ToCore`): :class:`Start` once, then :class:`Submit`, :class:`Cancel`,
:class:`Measure`, and :class:`Close` at the end.

Core → server (:data:`ToServer`): :class:`Ready` or :class:`Failed` once, then :class:`Step` once
per engine step (every stream's new tokens, a :class:`StreamStep` each), :class:`Status` every
:data:`STATUS_S`, and :class:`Measured` for each :class:`Measure`.

``measure`` is for exllamav3's pictures: the core's vision tower says each picture's patch grid
(how many placeholder tokens the prompt gives it), as the request thread asks it in one process;
the pictures themselves then travel in the request's ``prefill_inputs`` and the core's engine
thread runs the vision tower on them.
"""

from __future__ import annotations

import io
import pickle
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, NamedTuple

from sparkfold.engines.generator import EngineFailure, GenerationReport, SamplingParams, TokenLogprob

__all__ = [
    "STATUS_S",
    "Cancel",
    "Close",
    "Failed",
    "Measure",
    "Measured",
    "Ready",
    "Start",
    "Status",
    "Step",
    "StreamStep",
    "Submit",
    "ToCore",
    "ToServer",
    "portable_error",
    "recv",
    "send",
]

STATUS_S = 0.5
"""How often the core sends its health snapshot (``/health``'s pool, stall and ok)."""


# --- server -> core ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Start:
    """Load the engine these settings name (``EngineSettings`` as JSON)."""

    settings_json: str


@dataclass(frozen=True, slots=True)
class Submit:
    """Generate for one request; its tokens come back in :class:`Step` messages under ``id``."""

    id: int
    prompt_ids: list[int]
    params: SamplingParams


@dataclass(frozen=True, slots=True)
class Cancel:
    """The request's client left: end it."""

    id: int


@dataclass(frozen=True, slots=True)
class Measure:
    """Measure pictures with the vision tower's preprocessing (answered by :class:`Measured`)."""

    id: int
    pictures: list[Any]


@dataclass(frozen=True, slots=True)
class Close:
    """End what runs and exit."""


# --- core -> server ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Ready:
    """The engine loaded: what the server's side needs to know of it (``core.main``'s ``_ready_info``)."""

    info: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Failed:
    """The engine could not load; ``unavailable``: this host cannot run it at all."""

    unavailable: bool
    message: str


class StreamStep(NamedTuple):
    """One stream's part of a step: its new tokens, their log-probabilities, its report, and
    ``end``: ``None`` while it runs, ``("done",)`` or ``("error", exception)``."""

    id: int
    tokens: list[int]
    logprobs: list[TokenLogprob]
    report: GenerationReport | None
    end: tuple[Any, ...] | None


@dataclass(frozen=True, slots=True)
class Step:
    """Every stream's new tokens of one engine step, in one message."""

    streams: list[StreamStep]


@dataclass(frozen=True, slots=True)
class Status:
    """The health snapshot (ok, stall, pool, metrics)."""

    snapshot: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Measured:
    """The pictures' patch grids, or why they could not be read."""

    id: int
    answer: list[list[int]] | BaseException


ToCore = Start | Submit | Cancel | Measure | Close
ToServer = Ready | Failed | Step | Status | Measured
_MESSAGES = (Start, Submit, Cancel, Measure, Close, Ready, Failed, Step, Status, Measured)


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj: Any) -> Any:
        from sparkfold.glm.grammar import ConstrainedMatcher

        if isinstance(obj, ConstrainedMatcher):
            if obj.spec is None:
                raise ValueError("this structured-output matcher has no spec to rebuild it from")
            return ("matcher", obj.spec)
        return None


class _Unpickler(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, matchers: Any) -> None:
        super().__init__(file)
        self._matchers = matchers

    def persistent_load(self, pid: Any) -> Any:
        kind, spec = pid
        if kind != "matcher" or self._matchers is None:
            raise pickle.UnpicklingError(f"cannot rebuild a {kind!r} here")
        return self._matchers.build(spec)


def send(conn: Connection, message: ToCore | ToServer) -> None:
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(message)
    conn.send_bytes(buffer.getbuffer())


def recv(conn: Connection, matchers: Any = None) -> ToCore | ToServer:
    """The next message; ``matchers`` (a ``MatcherFactory``) rebuilds structured-output matchers."""
    message = _Unpickler(io.BytesIO(conn.recv_bytes()), matchers).load()
    if not isinstance(message, _MESSAGES):
        raise pickle.UnpicklingError(f"not an engine core message: {type(message).__name__}")
    return message


def portable_error(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling, else an :class:`EngineFailure` with its text."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return EngineFailure(str(exc) or type(exc).__name__)
    return exc
