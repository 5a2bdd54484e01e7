"""Loading an engine in this process, and the errors that stop a rank from starting.

:func:`load_engine` is what a rank 0 without a peer process loads: the node's supervisor
(``sparkfold.node.supervisor``) in the server's process, an engine core
(``sparkfold.engines.core.main``) in its own; both raise the same :class:`RankError` lines. They
live here, below both, because node/ stands above engines/ (engines never import node/).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from sparkfold.config import EngineSettings

if TYPE_CHECKING:
    from sparkfold.engines.generator import Generator

__all__ = ["EngineUnavailable", "RankError", "load_engine"]

log = logging.getLogger("sparkfold.engine")


class RankError(RuntimeError):
    """This rank cannot start (settings differ between ranks, model missing …): one line, exit 1."""


class EngineUnavailable(RankError):
    """``engine.kind`` names an engine this build cannot run yet."""


def load_engine(engine: EngineSettings, on_fatal: Callable[[str], None]) -> Generator:
    """The generator of a rank 0 without a peer process: exllamav3, or transformers with ``tp = 1``.

    What the rank supervisor loads in its own process, and an engine core (``[engine] core_process``)
    in its own. Raises :class:`RankError` (:class:`EngineUnavailable`) with the operator's line.
    """
    if engine.kind == "transformers":
        from sparkfold.engines.transformers.backend import load as load_transformers

        try:
            loaded_t = load_transformers(engine, 0, None, on_fatal=on_fatal)
        except (FileNotFoundError, ValueError) as exc:
            raise RankError(str(exc)) from None
        log.info("loaded %s in %.1f s", loaded_t.source.describe(), loaded_t.load_s)
        assert loaded_t.generator is not None  # rank 0 of tp = 1 always serves
        loaded_t.generator.start_phases = {"load_s": round(loaded_t.load_s, 2)}
        return loaded_t.generator
    from sparkfold.engines.exllamav3 import WARMUP_PHASES, Exllamav3Unavailable, PoolTooSmall, load

    try:
        loaded = load(engine, on_fatal=on_fatal)
    except Exllamav3Unavailable as exc:
        raise EngineUnavailable(str(exc)) from None
    except (PoolTooSmall, FileNotFoundError, ValueError) as exc:
        raise RankError(str(exc)) from None
    log.info("loaded %s in %.1f s: %s", engine.model, loaded.load_s, loaded.plan)
    warmup_s = round(sum(float(loaded.plan.get(phase) or 0.0) for phase in WARMUP_PHASES), 2)
    loaded.generator.start_phases = {"load_s": round(loaded.load_s - warmup_s, 2), "warmup_s": warmup_s}
    return loaded.generator
