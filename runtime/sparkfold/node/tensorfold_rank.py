"""Supervise one TensorFold rank (``[engine] kind = "tensorfold"``).

TensorFold runs as a child process (``docker run`` of the engine image, or ``tensorfold serve``
on the host); this module is what systemd sees in its place:

- the launch plan from :mod:`sparkfold.engines.tensorfold.launch`, with the fabric facts given in
  ``[fabric]``, or (two ranks, facts not written out) discovered at start by
  :func:`sparkfold.node.fabric.discover` without the ping (the fabric stage proved the link);
- READY once the rank is ready (rank 1: its "ready … following rank 0" line; rank 0: ``/health``
  says ``"ok": true``), with progress in the unit's STATUS while it loads;
- WATCHDOG pings only while the rank makes progress (:mod:`sparkfold.node.liveness`: rank 0's
  ``/health`` counters move, or it answers a 1-token request when idle) and the peer answers; a
  rank whose process lives but does no work is restarted by systemd's watchdog;
- the peer watch: TensorFold itself would wait for a lost peer, so when the other node falls
  silent past ``peer_timeout_s`` the rank is stopped and the supervisor exits non-zero (systemd
  restarts it, and the pair meets again at rendezvous);
- rank 0 records the peer watch's state for the gateway's ``/health``
  (:func:`~sparkfold.node.peer.record_peer`);
- SIGTERM stops the rank (``docker stop -t stop_timeout_s``) and exits 0.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sparkfold.config import Settings
from sparkfold.engines.tensorfold.launch import FabricFacts, LaunchError, LaunchPlan, launch_plan
from sparkfold.engines.tensorfold.process import RankProcess, RankStartError, image_key
from sparkfold.engines.tensorfold.profile import ProfileError, profile_of, refusal
from sparkfold.node.budget import budget
from sparkfold.node.checks import Runner, run_command
from sparkfold.node.fabric import DEFAULT_SYSFS, discover
from sparkfold.node.guard import new_kill_lines
from sparkfold.node.liveness import Liveness, Verdict
from sparkfold.node.marker import mark_serving
from sparkfold.node.notify import notify, watchdog_interval_s
from sparkfold.node.peer import record_peer, start_peer_watch
from sparkfold.node.roce import fabric_facts
from sparkfold.units import GIB

__all__ = ["check_image", "fabric_facts_for", "image_report", "plan_for", "run_tensorfold_rank"]

log = logging.getLogger("sparkfold.engine")


def fabric_facts_for(
    settings: Settings, *, sysfs: Path = DEFAULT_SYSFS, run: Runner = run_command
) -> FabricFacts | None:
    """``[fabric]``'s facts when all are written out; else, for two ranks, discovered now."""
    given = FabricFacts.from_settings(settings.fabric)
    if given is not None or settings.engine.tp == 1:
        return given
    report = discover(settings, sysfs=sysfs, run=run, ping=False)
    found = fabric_facts(report)
    if found is None:
        why = "; ".join(check.line() for check in report.failures) or "no RDMA device on the link"
        raise LaunchError(f"fabric discovery found no RoCE link for NCCL: {why}")
    return found


def plan_for(settings: Settings, *, facts: FabricFacts | None = None) -> LaunchPlan:
    """The rank's launch plan; fabric facts as given, from ``[fabric]``, or discovered; the
    container capped at the memory budget's limit (:mod:`sparkfold.node.budget`)."""
    facts = facts or fabric_facts_for(settings)
    limit = int(budget(settings).limit_gib * GIB) or None
    return launch_plan(settings, facts, image_key=image_key(settings), memory_bytes=limit)


def image_report(settings: Settings) -> str:
    """One line for ``--dry-run``: the image profile and whether it honours these settings."""
    try:
        profile = profile_of(settings)
    except ProfileError as exc:
        return f"unknown: {exc}"
    refused = refusal(settings, profile)
    return f"REFUSED: {refused}" if refused else f"{profile}: honours these settings"


def check_image(settings: Settings) -> None:
    """Refuse settings the engine image cannot honour (its profile), before anything starts."""
    try:
        refused = refusal(settings, profile_of(settings))
    except ProfileError as exc:
        refused = str(exc)
    if refused is not None:
        raise RankStartError(refused)


def _liveness(settings: Settings, interval_s: float) -> Liveness:
    """Rank 0's progress checks; a probe never takes longer than one watchdog tick."""
    tensorfold = settings.engine.tensorfold
    return Liveness(
        settings.engine_url,
        stall_s=settings.engine.stall_s,
        probe_every_s=tensorfold.probe_every_s,
        probe_timeout_s=max(1.0, interval_s),
    )


def run_tensorfold_rank(settings: Settings, die: Callable[[str], Any]) -> int:
    """Run the rank until SIGTERM (exit 0), its own exit (its code), or a lost peer (``die``)."""
    check_image(settings)
    rank = RankProcess(plan_for(settings))
    stopping = threading.Event()

    def lost(message: str) -> None:
        if not stopping.is_set():
            log.critical("%s; stopping the local rank", message)
            rank.stop(timeout_s=10)
        die(message)

    watch = start_peer_watch(settings, lost)

    def stop(signum: int, frame: object) -> None:
        stopping.set()

    def progress(note: str) -> None:
        log.info("%s", note)
        notify(f"STATUS={note}")

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        rank.start()
        rank.wait_ready(progress=progress)
    except RankStartError:
        if watch is not None:
            watch.stop()
        rank.stop()
        raise
    status = "serving on the engine port" if settings.node.rank == 0 else "following rank 0"
    log.info("rank %d ready: %s", settings.node.rank, status)
    notify("READY=1", f"STATUS=rank {settings.node.rank} ready, {status}")
    mark_serving(settings, port_open_at=rank.port_open_at)
    watchdog = watchdog_interval_s()
    interval = watchdog or 1.0
    liveness = _liveness(settings, interval) if watchdog and settings.node.rank == 0 else None
    stalled = ""
    # TensorFold's /health has no peer block: the gateway on the head reads the watch's (peer.json)
    recorder = watch if watch is not None and settings.node.rank == 0 else None
    if recorder is not None:
        record_peer(recorder.state())
    while not stopping.wait(interval):
        if recorder is not None:
            record_peer(recorder.state())
        if rank.returncode is not None:
            code = rank.wait()
            log.critical("rank %d exited with code %d: %s", settings.node.rank, code, (rank.tail or [""])[-1])
            for line in new_kill_lines(settings):
                log.critical("%s", line)
            return code or 1
        if watch is not None and not watch.alive():
            continue
        verdict = liveness.check() if liveness is not None else Verdict(True)
        if verdict.ok:
            if stalled:
                log.info("rank %d makes progress again", settings.node.rank)
                notify(f"STATUS=rank {settings.node.rank} ready, {status}")
            stalled = ""
            notify("WATCHDOG=1")
        else:
            if not stalled:
                log.warning(
                    "rank %d makes no progress: %s; the watchdog is not fed",
                    settings.node.rank,
                    verdict.reason,
                )
            stalled = verdict.reason
            notify(f"STATUS=no progress: {stalled}")
    if liveness is not None:
        liveness.close()
    notify("STOPPING=1", "STATUS=stopping")
    if watch is not None:
        watch.stop()
    rank.stop()
    log.info("stopped")
    return 0
