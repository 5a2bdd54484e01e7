"""What the engine server and its engine core (``[engine] core_process``) send each other, and how.

Messages are tuples pickled onto a ``multiprocessing`` connection (length-prefixed frames over
a socket pair) by a pickler of our own for one reason: a structured-output matcher
(:class:`~sparkfold.glm.grammar.ConstrainedMatcher`) holds xgrammar state that cannot be
pickled, so it travels as its :class:`~sparkfold.glm.grammar.MatcherSpec` and the core builds
the same matcher with its :class:`~sparkfold.glm.grammar.MatcherFactory`. Everything else
(sampling parameters, picture tensors, reports, log-probabilities) is pickled by value.

Server → core: ``("start", engine_settings_json)``, ``("submit", id, prompt_ids, params)``,
``("cancel", id)``, ``("measure", id, pictures)``, ``("close",)``.

Core → server: ``("ready", info)`` or ``("failed", unavailable, message)`` once, then
``("step", [(id, tokens, logprobs, report, end), ...])`` once per engine step (every stream's new
tokens; ``end`` is ``None``, ``("done",)`` or ``("error", exception)``), ``("status", snapshot)``
every :data:`STATUS_S`, and ``("measured", id, grids or exception)`` for each ``measure``.

``measure`` is for exllamav3's pictures: the core's vision tower says each picture's patch grid
(how many placeholder tokens the prompt gives it), as the request thread asks it in one process;
the pictures themselves then travel in the request's ``prefill_inputs`` and the core's engine
thread runs the vision tower on them.
"""

from __future__ import annotations

import io
import pickle
from multiprocessing.connection import Connection
from typing import Any

from sparkfold.engines.generator import EngineFailure

__all__ = ["STATUS_S", "portable_error", "recv", "send"]

STATUS_S = 0.5
"""How often the core sends its health snapshot (``/health``'s pool, stall and ok)."""


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


def send(conn: Connection, message: tuple[Any, ...]) -> None:
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(message)
    conn.send_bytes(buffer.getbuffer())


def recv(conn: Connection, matchers: Any = None) -> tuple[Any, ...]:
    """The next message; ``matchers`` (a ``MatcherFactory``) rebuilds structured-output matchers."""
    message = _Unpickler(io.BytesIO(conn.recv_bytes()), matchers).load()
    assert isinstance(message, tuple)
    return message


def portable_error(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling, else an :class:`EngineFailure` with its text."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return EngineFailure(str(exc) or type(exc).__name__)
    return exc
