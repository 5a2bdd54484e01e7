"""The memory guard's kills as sparkfold reads them, and what each one says to change.

The guard is earlyoom (``roles/sparkfold_guard``): when the node's available memory falls below
half of ``memory.reserve_gib`` it kills the engine rank first (the rank carries the highest
``oom_score_adj``; sshd, systemd, the gateway and earlyoom itself are avoided). After each kill
its ``-N`` hook appends one line to ``<paths.state_dir>/guard/memory-kills``::

    <epoch seconds> <pid> <process name>

That file is the one signal: the engine's supervisor logs one line for each kill it has not
reported yet (:func:`new_kill_lines`, when its rank dies and again at its next start, so a kill of
a rank that runs inside the supervisor is reported too), the gateway counts them
(``sparkfold_engine_memory_kills_total``) and ``sparkfold doctor`` shows the last one. A kill
means the engine outgrew its budget by at least what the node gave up of its reserve: its
headroom plus half the reserve.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path

from sparkfold.config import Settings
from sparkfold.node.budget import Budget, budget

__all__ = [
    "KILLS_FILE",
    "TRIGGER_SHARE",
    "MemoryKill",
    "kill_line",
    "kills_path",
    "new_kill_lines",
    "read_kills",
]

KILLS_FILE = Path("guard/memory-kills")
"""Under ``paths.state_dir``: one line per kill, written by the guard's hook."""
TRIGGER_SHARE = 0.5
"""The guard acts when available memory falls below this share of ``memory.reserve_gib``."""


@dataclass(frozen=True)
class MemoryKill:
    """One kill by the guard: when, which process."""

    at: float
    pid: int
    name: str

    def when(self) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.at))


def kills_path(settings: Settings) -> Path:
    return settings.paths.state_dir / KILLS_FILE


def read_kills(path: Path) -> list[MemoryKill]:
    """Every kill recorded in ``path``, oldest first; none when the file is absent or unreadable."""
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
    kills: list[MemoryKill] = []
    for line in lines:
        fields = line.split(" ", 2)
        if len(fields) == 3 and fields[0].isdigit() and fields[1].isdigit():
            kills.append(MemoryKill(float(fields[0]), int(fields[1]), fields[2]))
    return kills


def kill_line(kill: MemoryKill, plan: Budget) -> str:
    """One line: what happened, and which setting to lower by how much."""
    over = max(0.0, plan.headroom_gib) + plan.reserve_gib * TRIGGER_SHARE
    return (
        f"the memory guard killed the engine rank (pid {kill.pid} {kill.name!r}) at {kill.when()}: "
        f"this node's available memory fell below {plan.reserve_gib * TRIGGER_SHARE:g} GiB, so the "
        f"engine held at least {over:.1f} GiB more than its budget ({plan.sum_text()}); "
        f"{plan.advice(over)}; systemd restarts the rank"
    )


def new_kill_lines(settings: Settings, root: Path = Path("/")) -> list[str]:
    """The lines for the kills not reported before; remembers them as reported (``*.seen``)."""
    path = kills_path(settings)
    kills = read_kills(path)
    seen_file = path.with_name(path.name + ".seen")
    try:
        seen = int(seen_file.read_text(encoding="utf-8").strip() or 0)
    except (OSError, ValueError):
        seen = 0
    fresh = kills[seen:] if seen <= len(kills) else kills
    if not fresh:
        return []
    plan = budget(settings, root)
    with contextlib.suppress(OSError):  # unwritable: reported again next time rather than never
        seen_file.write_text(f"{len(kills)}\n", encoding="utf-8")
    return [kill_line(kill, plan) for kill in fresh]
