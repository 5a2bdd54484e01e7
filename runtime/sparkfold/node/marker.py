"""The serving marker: which engine configuration this node's rank serves right now.

Once a rank is READY, the supervisor writes ``serving.json`` (the engine fingerprint, its pid, its
rank, ``load_s``: the seconds from the supervisor's process start to READY, this start's cold
load, ``start``: ``first`` or ``restart`` (whether the compile caches held anything,
:mod:`sparkfold.engines.compile_cache`), and ``phases``: the start's load, warm-up and first-token
seconds) into the engine unit's ``RuntimeDirectory`` (``/run/sparkfold-engine``, named by systemd in
``$RUNTIME_DIRECTORY``). systemd removes that folder when the unit stops, so the file exists exactly
while a rank runs; outside systemd (a shell, the tests) nothing is written.

``sparkfold preflight`` reads it: memory a serving rank holds is not "missing", and a rank that
already serves the candidate configuration has nothing left to load or write. The gateway reads
``load_s``, ``start`` and ``phases`` into ``sparkfold_engine_load_seconds``; ``sparkfold startup``
reads ``port_s`` (when the engine port first answered, rank 0).

:func:`write_record` / :func:`read_record` are the one way records go through that folder (the
marker; the TensorFold supervisor's peer state, :mod:`sparkfold.node.peer`, read by the gateway): a
record names its writer's pid, and a record whose writer is gone reads as none.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkfold.config import Settings, engine_fingerprint

if TYPE_CHECKING:
    from sparkfold.engines.generator import Generator

__all__ = [
    "MARKER",
    "RUN_DIR",
    "Serving",
    "describe_start",
    "mark_serving",
    "process_age_s",
    "read_record",
    "serving",
    "start_phases",
    "write_record",
]

RUN_DIR = Path("run/sparkfold-engine")  # relative to the root; the engine unit's RuntimeDirectory
MARKER = "serving.json"


@dataclass(frozen=True)
class Serving:
    """A running rank: the engine fingerprint it loaded, its supervisor's pid, its rank."""

    fingerprint: str
    pid: int
    rank: int
    load_s: float | None = None  # process start to READY (None: not known)
    port_s: float | None = None  # process start to the engine port's first answer (rank 0)
    start: str | None = None  # "first" or "restart" (the compile caches held something)
    phases: dict[str, float] | None = None  # load_s, warmup_s, first_token_s


def write_record(
    name: str, record: Mapping[str, object], env: Mapping[str, str] | None = None
) -> Path | None:
    """Write ``record`` (with this process's pid) as ``name`` in the engine unit's
    ``RuntimeDirectory``, atomically; its path, or None outside a systemd unit or on an error."""
    folder = (os.environ if env is None else env).get("RUNTIME_DIRECTORY", "").split(":")[0]
    if not folder:
        return None
    path = Path(folder) / name
    partial = path.with_suffix(".partial")
    try:
        partial.write_text(json.dumps({**record, "pid": os.getpid()}), encoding="utf-8")
        partial.replace(path)
    except OSError:
        return None  # a record only informs another process; never a reason to stop
    return path


def read_record(name: str, root: Path = Path("/")) -> dict[str, Any] | None:
    """The record ``name`` of the engine unit, while the process that wrote it still runs."""
    try:
        data = json.loads((root / RUN_DIR / name).read_text(encoding="utf-8"))
        alive = (root / "proc" / str(int(data["pid"]))).is_dir()
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return data if alive and isinstance(data, dict) else None


def start_phases(generator: Generator, first_token_s: float) -> dict[str, float]:
    """The start's phases: the engine's own (``load_s``, ``warmup_s``: ``start_phases`` of its
    generator) and the start-up probe's ``first_token_s``."""
    phases = dict(generator.start_phases)
    return {**phases, "first_token_s": round(first_token_s, 2)}


def describe_start(start: str, phases: Mapping[str, float], ready_s: float | None) -> str:
    """The start line's tail, e.g. ``ready in 41.2 s (restart start): load 30.1 s, warm-up 9.8 s,
    first token 0.31 s``."""
    names = {"load_s": "load", "warmup_s": "warm-up", "first_token_s": "first token"}
    parts = ", ".join(f"{names.get(key, key)} {value:g} s" for key, value in phases.items())
    ready = "ready" if ready_s is None else f"ready in {ready_s:g} s"
    return f"{ready} ({start} start): {parts}"


def mark_serving(
    settings: Settings,
    env: Mapping[str, str] | None = None,
    *,
    port_open_at: float | None = None,
    start: str | None = None,
    phases: Mapping[str, float] | None = None,
) -> Path | None:
    """Write the marker for this process (READY); its path, or None outside a systemd unit.
    ``port_open_at``: the ``time.monotonic()`` at which the engine port first answered; ``start``
    and ``phases``: :func:`describe_start`'s."""
    load_s = process_age_s()
    port_s = None
    if load_s is not None and port_open_at is not None:
        port_s = round(max(0.0, load_s - (time.monotonic() - port_open_at)), 2)
    record = {
        "fingerprint": engine_fingerprint(settings),
        "rank": settings.node.rank,
        "load_s": load_s,
        "port_s": port_s,
        "start": start,
        "phases": dict(phases or {}),
    }
    return write_record(MARKER, record, env)


def process_age_s(proc: Path = Path("/proc")) -> float | None:
    """Seconds since this process started (the kernel's start time against its uptime); None where
    ``/proc`` does not say."""
    try:
        after_name = (proc / "self" / "stat").read_text(encoding="utf-8").rsplit(")", 1)[1].split()
        started_s = int(after_name[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime, in ticks
        uptime_s = float((proc / "uptime").read_text(encoding="utf-8").split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return round(max(0.0, uptime_s - started_s), 2)


def serving(root: Path = Path("/")) -> Serving | None:
    """The rank serving on this node, if one is: the marker names a process that still runs."""
    data = read_record(MARKER, root)
    try:
        if data is None:
            return None
        load_s, port_s, phases = data.get("load_s"), data.get("port_s"), data.get("phases")
        return Serving(
            str(data["fingerprint"]),
            int(data["pid"]),
            int(data["rank"]),
            float(load_s) if isinstance(load_s, (int, float)) else None,
            float(port_s) if isinstance(port_s, (int, float)) else None,
            data.get("start") if data.get("start") in ("first", "restart") else None,
            {str(k): float(v) for k, v in phases.items() if isinstance(v, (int, float))}
            if isinstance(phases, dict)
            else None,
        )
    except (KeyError, TypeError, ValueError):
        return None
