"""The serving marker: which engine configuration this node's rank serves right now.

Once a rank is READY, the supervisor writes ``serving.json`` (the engine fingerprint, its pid and
rank) into the engine unit's ``RuntimeDirectory`` (``/run/sparkfold-engine``, named by systemd in
``$RUNTIME_DIRECTORY``). systemd removes that folder when the unit stops, so the file exists exactly
while a rank runs; outside systemd (a shell, the tests) nothing is written.

``sparkfold preflight`` reads it: memory a serving rank holds is not "missing", and a rank that
already serves the candidate configuration has nothing left to load or write.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from sparkfold.config import Settings, engine_fingerprint

__all__ = ["MARKER", "RUN_DIR", "Serving", "mark_serving", "serving"]

RUN_DIR = Path("run/sparkfold-engine")  # relative to the root; the engine unit's RuntimeDirectory
MARKER = "serving.json"


@dataclass(frozen=True)
class Serving:
    """A running rank: the engine fingerprint it loaded, its supervisor's pid, its rank."""

    fingerprint: str
    pid: int
    rank: int


def mark_serving(settings: Settings, env: Mapping[str, str] | None = None) -> Path | None:
    """Write the marker for this process (READY); its path, or None outside a systemd unit."""
    folder = (os.environ if env is None else env).get("RUNTIME_DIRECTORY", "").split(":")[0]
    if not folder:
        return None
    marker = Path(folder) / MARKER
    record = Serving(engine_fingerprint(settings), os.getpid(), settings.node.rank)
    partial = marker.with_suffix(".partial")
    try:
        partial.write_text(json.dumps(asdict(record)), encoding="utf-8")
        partial.replace(marker)
    except OSError:
        return None  # the marker only saves work at the next preflight; never a reason to stop
    return marker


def serving(root: Path = Path("/")) -> Serving | None:
    """The rank serving on this node, if one is: the marker names a process that still runs."""
    try:
        data = json.loads((root / RUN_DIR / MARKER).read_text(encoding="utf-8"))
        record = Serving(str(data["fingerprint"]), int(data["pid"]), int(data["rank"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return record if (root / "proc" / str(record.pid)).is_dir() else None
