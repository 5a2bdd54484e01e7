"""How long this node's engine start took to serve (``sparkfold startup``, the verify stage's last lines).

One origin, three marks, all on the node's ``CLOCK_MONOTONIC``:

- the start: systemd's ``ExecMainStartTimestampMonotonic`` of ``sparkfold-engine.service``, when its
  main process (the rank's supervisor) was forked, after ``ExecStartPre`` (preflight). For a
  ``Type=notify`` unit ``ActiveEnterTimestamp`` is READY, the end of the start, not its beginning;
- port open: the supervisor's own record (``port_s`` in the serving marker,
  :mod:`sparkfold.node.marker`: its process age when the engine port first answered);
- ready: systemd's ``ActiveEnterTimestampMonotonic``, the unit's READY (rank 0: the engine answers
  and ``/health`` says ready; rank 1: it follows rank 0);
- first streamed token (rank 0 only): the smoke request's client clock, one streamed chat completion
  through the gateway on this node. Recorded once per start (``first-token.json`` beside the marker,
  naming the rank's pid), so a later run reports that start's figure again; its own time to first
  token is reported apart.

With a drafter configured, the head's line also names the drafter's files, by the ``digest`` of the
manifest the weights stage wrote beside its folder (``DIR.manifest.json``: the same files give the same
digest, so two pairs can compare), and the smoke request's drafts accepted.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from sparkfold.config import Settings
from sparkfold.node.checks import Runner, run_command
from sparkfold.node.marker import RUN_DIR, serving
from sparkfold.weights import WeightsError, default_manifest_path, read_manifest

__all__ = [
    "ENGINE_UNIT",
    "FIRST_TOKEN_RECORD",
    "Startup",
    "UnitStart",
    "configured_drafter",
    "gateway_url",
    "startup",
    "unit_start",
]

ENGINE_UNIT = "sparkfold-engine.service"
FIRST_TOKEN_RECORD = "first-token.json"
_PROPERTIES = ("ExecMainStartTimestampMonotonic", "ActiveEnterTimestampMonotonic", "ExecMainPID")
SHORT_DIGEST = 12  # hex digits of a digest on the line (as the image's tf.patches label)


@dataclass(frozen=True)
class UnitStart:
    """systemd's record of the unit's current start (monotonic microseconds; 0: not yet)."""

    start_us: int
    ready_us: int
    pid: int

    @property
    def ready_s(self) -> float | None:
        return round((self.ready_us - self.start_us) / 1e6, 2) if self.ready_us > self.start_us > 0 else None


@dataclass(frozen=True)
class Startup:
    """What ``sparkfold startup --json`` prints."""

    unit: str
    rank: int
    pid: int | None
    port_open_s: float | None
    ready_s: float | None
    first_token_s: float | None
    smoke: dict[str, Any] | None
    problem: str | None = None
    drafter: str | None = None  # the configured draft model's directory (rank 0), if any
    drafter_digest: str | None = None  # its manifest's digest; None: no readable manifest

    def line(self) -> str:
        """One line for people: the seconds from the unit's start to each mark."""
        if self.problem is not None:
            return f"{self.unit} (rank {self.rank}): {self.problem}"

        def mark(seconds: float | None) -> str:
            return "?" if seconds is None else f"{seconds:.1f} s"

        marks = [f"/health ready {mark(self.ready_s)}"]
        if self.rank == 0:
            marks = [
                f"port open {mark(self.port_open_s)}",
                *marks,
                f"first streamed token {mark(self.first_token_s)}",
            ]
        if self.drafter is not None and self.smoke is not None:
            digest = f"digest {self.drafter_digest[:SHORT_DIGEST]}" if self.drafter_digest else "no manifest"
            marks.append(f"drafter {self.drafter} ({digest}): {_acceptance(self.smoke)}")
        return f"{self.unit} (rank {self.rank}, pid {self.pid}) from its start: " + ", ".join(marks)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "line": self.line()}


def unit_start(run: Runner = run_command, unit: str = ENGINE_UNIT) -> UnitStart | None:
    """The unit's start as systemd records it; None where systemd does not say (not installed)."""
    done = run(["systemctl", "show", unit, *(f"--property={name}" for name in _PROPERTIES)])
    if done.returncode != 0:
        return None
    values = dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line)
    try:
        found = UnitStart(*(int(values[name]) for name in _PROPERTIES))
    except (KeyError, ValueError):
        return None
    return found if found.start_us > 0 else None


def gateway_url(settings: Settings) -> str:
    """The gateway's root on this node as the node reaches it (a wildcard bind answers on loopback);
    the clients of ``sparkfold.bench.client`` add ``/v1/...`` themselves."""
    host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "[::1]"}.get(settings.api.host, settings.api.host)
    host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    return f"http://{host}:{settings.api.port}"


Smoke = Callable[[Callable[[], object]], dict[str, Any]]
"""Send the smoke request; call the argument as its first token arrives; its report (``ok``, …)."""


def startup(
    settings: Settings,
    smoke: Smoke | None,
    *,
    run: Runner = run_command,
    root: Path = Path("/"),
    clock: Callable[[], float] = time.monotonic,
) -> Startup:
    """This node's engine start: systemd's marks, the supervisor's port record, and (``smoke`` given,
    rank 0) the smoke request's first token, timed against the unit's start."""
    rank = settings.node.rank
    unit = unit_start(run)
    marker = serving(root)
    port_s = marker.port_s if marker is not None and unit is not None and marker.pid == unit.pid else None
    report: dict[str, Any] | None = None
    first_token_s: float | None = None
    if smoke is not None and rank == 0:
        seen: list[float] = []
        report = smoke(lambda: seen.append(clock()))
        if unit is not None:
            fresh = round(seen[0] - unit.start_us / 1e6, 2) if seen else None
            first_token_s = _first_token_of(unit.pid, fresh, root / RUN_DIR)
    problem = None if unit is not None else f"systemd has no running {ENGINE_UNIT} on this node"
    drafter = configured_drafter(settings) if rank == 0 else None
    return Startup(
        unit=ENGINE_UNIT,
        rank=rank,
        pid=unit.pid if unit else None,
        port_open_s=port_s,
        ready_s=unit.ready_s if unit else None,
        first_token_s=first_token_s,
        smoke=report,
        problem=problem,
        drafter=drafter,
        drafter_digest=_manifest_digest(root / drafter.lstrip("/")) if drafter is not None else None,
    )


def _acceptance(smoke: dict[str, Any]) -> str:
    """The smoke request's drafts, from the engine's stats block."""
    drafted, accepted = smoke.get("drafted"), smoke.get("accepted")
    if not isinstance(drafted, int) or not isinstance(accepted, int):
        return "drafts not reported by the engine"
    rate = f" ({accepted / drafted:.0%})" if drafted else ""
    return f"{accepted} of {drafted} drafted tokens accepted{rate}"


def _manifest_digest(folder: Path) -> str | None:
    """The digest of the manifest beside ``folder`` (the weights stage's), or None where it has none."""
    try:
        return read_manifest(default_manifest_path(folder)).digest
    except (WeightsError, OSError):
        return None


def configured_drafter(settings: Settings) -> str | None:
    """The draft model directory the engine is set to load (exllamav3, tensorfold), or None."""
    kind = getattr(settings.engine, settings.engine.kind, None)
    drafter = getattr(kind, "drafter", "none")
    return None if drafter in ("none", "", None) else str(drafter)


def _first_token_of(pid: int, fresh: float | None, folder: Path) -> float | None:
    """The first token this start (the rank ``pid``) streamed: recorded by an earlier run, else
    ``fresh`` (this run's), then recorded for the next run."""
    path = folder / FIRST_TOKEN_RECORD
    try:
        recorded = json.loads(path.read_text(encoding="utf-8"))
        if recorded.get("pid") == pid and isinstance(recorded.get("first_token_s"), (int, float)):
            return float(recorded["first_token_s"])
    except (OSError, ValueError, AttributeError):
        pass
    if fresh is not None and folder.is_dir():
        with contextlib.suppress(OSError):  # the record only spares a later run; the figure stands
            path.write_text(json.dumps({"pid": pid, "first_token_s": fresh}), encoding="utf-8")
    return fresh
