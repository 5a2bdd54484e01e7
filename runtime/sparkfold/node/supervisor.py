"""Run this node's engine rank and keep systemd informed.

:func:`run_rank` is what ``sparkfold engine`` runs: peer watch (``tp = 2``), the engine per
``engine.kind``, READY once serving (rank 0, after a one-token probe) or loaded (rank 1),
WATCHDOG pings while healthy, and on SIGTERM a drain of in-flight requests for up to
``engine.drain_s`` before exiting 0. A lost peer or a failed collective logs one line and exits
non-zero at once (``os._exit``: a stuck gloo call cannot hold the process).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from sparkfold.config import Settings
from sparkfold.engines.compile_cache import use_compile_caches
from sparkfold.engines.models import resolve_model
from sparkfold.engines.startup import EngineUnavailable, RankError, load_engine
from sparkfold.node.guard import new_kill_lines
from sparkfold.node.marker import describe_start, mark_serving, process_age_s, start_phases
from sparkfold.node.notify import notify, watchdog_interval_s
from sparkfold.node.peer import HEARTBEAT_PORT_OFFSET, PeerWatch, start_peer_watch
from sparkfold.protocol import PeerState

if TYPE_CHECKING:
    from sparkfold.engines.generator import Generator

__all__ = ["describe", "feed_watchdog", "run_rank"]

log = logging.getLogger("sparkfold.engine")

RENDEZVOUS_TIMEOUT_S = 3600.0  # how long one rank waits for the other to load (the peer watch is faster)


def _die(message: str) -> None:
    """Log one line and leave now, whatever other threads are stuck in."""
    log.critical("%s", message)
    _flush_logs()
    notify(f"STATUS={message}")
    os._exit(1)


def report_memory_kills(settings: Settings) -> None:
    """One line per kill of the memory guard not reported yet (:mod:`sparkfold.node.guard`)."""
    for line in new_kill_lines(settings):
        log.critical("%s", line)


def _flush_logs() -> None:
    for handler in logging.getLogger().handlers:
        handler.flush()


def _configure_logging(settings: Settings) -> None:
    if logging.getLogger().handlers:
        return
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format=f"%(asctime)s sparkfold-engine[rank {settings.node.rank}] %(levelname)s %(message)s",
    )


def describe(settings: Settings) -> dict[str, Any]:
    """What :func:`run_rank` would run with these settings (``sparkfold engine --dry-run``)."""
    engine, fabric, rank = settings.engine, settings.fabric, settings.node.rank
    if engine.kind == "tensorfold":
        from sparkfold.engines.tensorfold.launch import LaunchError
        from sparkfold.node.tensorfold_rank import image_report, plan_for

        try:
            launch = plan_for(settings).as_dict()
        except LaunchError as exc:
            raise RankError(str(exc)) from None
        return {"kind": engine.kind, **launch, "image": image_report(settings)}
    try:
        model = resolve_model(engine.model, engine.transformers.gguf_file).describe()
    except FileNotFoundError as exc:
        model = f"unresolved: {exc}"
    plan: dict[str, Any] = {
        "kind": engine.kind,
        "model": model,
        "served_name": engine.served_name,
        "rank": rank,
        "tp": engine.tp,
        "serve": f"http://{engine.host}:{engine.port}/v1" if rank == 0 else None,
        "runs": (
            f"the {engine.kind} engine in a process of its own (the engine core); HTTP in this one"
            if engine.core_process
            else "in this process (the exllamav3 engine on this host's GPUs)"
            if engine.kind == "exllamav3"
            else "in this process (the transformers engine on CPU)"
        ),
        "env": {
            "torch_threads": engine.transformers.threads or "torch default",
            "NOTIFY_SOCKET": os.environ.get("NOTIFY_SOCKET"),
            "WATCHDOG_USEC": os.environ.get("WATCHDOG_USEC"),
        },
    }
    if engine.kind == "exllamav3":
        plan["exllamav3"] = engine.exllamav3.model_dump(mode="json")
    elif engine.tp > 1:
        master = fabric.address if rank == 0 else fabric.peer
        plan["rendezvous"] = f"{master}:{fabric.rendezvous_port}"
        plan["gloo_bind"] = str(fabric.address)
        plan["heartbeat"] = {
            "listen": f"{fabric.address}:{fabric.rendezvous_port + HEARTBEAT_PORT_OFFSET}",
            "peer": f"{fabric.peer}:{fabric.rendezvous_port + HEARTBEAT_PORT_OFFSET}",
            "every_s": fabric.heartbeat_s,
            "timeout_s": fabric.peer_timeout_s,
        }
    return plan


def run_rank(settings: Settings) -> int:
    """Run the engine rank to the end; the process exit code."""
    _configure_logging(settings)
    report_memory_kills(settings)  # the last run's, where the guard's kill took this process too
    engine = settings.engine
    if engine.kind == "tensorfold":
        from sparkfold.engines.tensorfold.launch import LaunchError
        from sparkfold.engines.tensorfold.process import RankStartError
        from sparkfold.node.tensorfold_rank import run_tensorfold_rank

        try:
            return run_tensorfold_rank(settings, die=_die)
        except (LaunchError, RankStartError) as exc:
            raise RankError(str(exc)) from None
    if engine.kind == "exllamav3" or engine.core_process:
        return _run_single(settings)
    if engine.kind != "transformers":
        raise EngineUnavailable(
            f'engine.kind = {engine.kind!r} is not available yet in this build; use "transformers"'
        )
    notify(f"MAINPID={os.getpid()}", "STATUS=starting")
    start = use_compile_caches(settings.paths.cache_dir)
    watch = start_peer_watch(settings, on_lost=_die)
    from sparkfold.engines.transformers.backend import load
    from sparkfold.engines.transformers.tensor_parallel import EngineMismatch, Rendezvous

    meeting = None
    if engine.tp > 1:
        fabric = settings.fabric
        meeting = Rendezvous(
            rank=settings.node.rank,
            address=str(fabric.address),
            peer=str(fabric.peer),
            port=fabric.rendezvous_port,
            timeout_s=RENDEZVOUS_TIMEOUT_S,
        )
    # rank 0 claims its HTTP port before the slow load (a busy port fails fast); it listens only
    # once serving, so the port stays closed until both ranks have loaded
    http = _listen(engine.host, engine.port) if settings.node.rank == 0 else None
    notify("STATUS=loading")
    try:
        loaded = load(engine, settings.node.rank, meeting, on_fatal=_die)
    except (EngineMismatch, FileNotFoundError, ValueError) as exc:
        raise RankError(str(exc)) from None
    log.info("loaded %s in %.1f s", loaded.source.describe(), loaded.load_s)
    if loaded.generator is None:
        return _follow(settings, loaded.runner, watch)
    assert http is not None
    loaded.generator.start_phases = {"load_s": round(loaded.load_s, 2)}
    return asyncio.run(_serve(settings, loaded.generator, watch, http, start))


def _run_single(settings: Settings) -> int:
    """One rank 0 on this host: exllamav3 (``tp`` = local GPUs, exllamav3's own workers), or an
    engine core of either engine (``[engine] core_process``: the engine in a child process)."""
    engine = settings.engine
    notify(f"MAINPID={os.getpid()}", "STATUS=starting")
    start = use_compile_caches(settings.paths.cache_dir)  # before the engine (or its core) imports Triton
    http = _listen(engine.host, engine.port)
    notify("STATUS=loading")
    if engine.core_process:
        from sparkfold.engines.core.client import CoreClient

        generator: Generator = CoreClient.start(engine)
    else:
        generator = load_engine(engine, _die)
    return asyncio.run(_serve(settings, generator, None, http, start))


def _follow(settings: Settings, runner: Any, watch: PeerWatch | None) -> int:
    """Rank 1: mirror rank 0 in a thread; the main thread handles signals and the watchdog."""
    from sparkfold.engines.generator import EngineFailure

    done = threading.Event()
    result = {"code": 0}

    def follow() -> None:
        # Whatever ends the following ends the rank: a thread that died silently (a collective's
        # "Connection reset by peer" when rank 0 was killed) left rank 1 active, its watchdog fed,
        # and the restarted rank 0 waiting for it at rendezvous for ever.
        try:
            runner.follow()
            log.info("rank 0 stopped; exiting")
        except EngineFailure as exc:
            log.critical("%s", exc)
            result["code"] = 1
        except Exception:
            log.exception("following rank 0 failed; exiting so systemd restarts this rank")
            result["code"] = 1
        finally:
            done.set()

    def stop(signum: int, frame: object) -> None:
        log.info("signal %d: leaving", signum)
        done.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    follower = threading.Thread(target=follow, name="follow", daemon=True)
    follower.start()
    log.info("rank 1 ready, following rank 0")
    notify("READY=1", "STATUS=loaded; following rank 0")
    mark_serving(settings)
    interval = watchdog_interval_s() or 1.0
    while not done.wait(interval):
        if watch is None or watch.alive():
            notify("WATCHDOG=1")
    notify("STOPPING=1")
    if follower.is_alive():  # signalled while waiting in a collective: nothing to drain on rank 1
        _flush_logs()
        os._exit(result["code"])
    return result["code"]


def _listen(host: str, port: int) -> socket.socket:
    """The engine server's socket, bound here so a busy port is one clear line."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise RankError(f"engine server could not listen on {host}:{port}: {exc.strerror}") from None
    sock.set_inheritable(True)
    return sock


def _single_rank() -> PeerState:
    return PeerState(rank=1, state="absent")


@contextlib.contextmanager
def _no_signal_capture() -> Iterator[None]:
    yield


async def _serve(
    settings: Settings, generator: Generator, watch: PeerWatch | None, http: socket.socket, start: str
) -> int:
    """Rank 0: the engine server until SIGTERM (drain, then 0); ``start``: ``first`` or ``restart``
    (:func:`~sparkfold.engines.compile_cache.use_compile_caches`)."""
    import uvicorn

    from sparkfold.engines.server import create_app
    from sparkfold.engines.service import EngineService

    engine = settings.engine
    generator.stall_s = engine.stall_s  # liveness from progress (ThreadedEngine.stalled_s)
    service = EngineService(
        generator,
        served_name=engine.served_name,
        max_tokens=engine.max_tokens,
        seed=engine.seed,
        thinking=engine.thinking,
        peer_state=watch.state if watch else _single_rank,
        forced_calls_per_tool=engine.forced_calls_per_tool,
    )
    service.ready = False  # until the probe below answered
    config = uvicorn.Config(
        create_app(service),
        host=engine.host,
        port=engine.port,
        lifespan="off",
        log_level="warning",
        timeout_graceful_shutdown=engine.drain_s,  # type: ignore[arg-type]  # seconds; a float works
    )
    server = uvicorn.Server(config)
    server.capture_signals = _no_signal_capture  # type: ignore[method-assign]  # we own SIGTERM

    def drain() -> None:
        if not server.should_exit:
            log.info("draining in-flight requests (up to %g s)", engine.drain_s)
            notify("STOPPING=1", "STATUS=draining")
        server.should_exit = True

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, drain)
    serving = asyncio.create_task(server.serve(sockets=[http]))
    try:
        while not server.started:
            if serving.done():
                serving.result()
                raise RankError("the engine server stopped while starting")
            await asyncio.sleep(0.05)
        port_open_at = time.monotonic()
        await _probe(engine.host, engine.port)
        phases = start_phases(generator, time.monotonic() - port_open_at)
        service.ready = True
        log.info(
            "serving %s at http://%s:%d/v1, rank 0 of %d (context %d); %s",
            engine.served_name,
            engine.host,
            engine.port,
            engine.tp,
            generator.context_length,
            describe_start(start, phases, process_age_s()),
        )
        notify("READY=1", f"STATUS=serving {engine.served_name}")
        mark_serving(settings, port_open_at=port_open_at, start=start, phases=phases)
        interval = watchdog_interval_s() or 1.0
        while not serving.done():
            await asyncio.wait([serving], timeout=interval)
            feed_watchdog(service)
        serving.result()
    finally:
        await asyncio.to_thread(generator.close)
    log.info("stopped")
    return 0


def feed_watchdog(service: Any) -> bool:
    """One watchdog turn of rank 0: ``WATCHDOG=1`` only while the engine's health is ok.

    Health includes progress (``ThreadedEngine.stalled_s`` past ``engine.stall_s``), so a wedged
    engine whose thread still lives stops the feeding and systemd restarts the rank.
    """
    if service.health().ok:
        notify("WATCHDOG=1")
        return True
    log.error("the engine is not healthy (%s); the watchdog is not fed", service.health().model_dump_json())
    return False


async def _probe(host: str, port: int) -> None:
    """One token through the server itself: READY means it really answers."""
    import httpx

    target = "127.0.0.1" if host in ("0.0.0.0", "") else host
    async with httpx.AsyncClient(base_url=f"http://{target}:{port}", timeout=120) as client:
        reply = await client.post("/v1/completions", json={"prompt": "Hello", "max_tokens": 1})
    if reply.status_code != 200:
        raise RankError(f"the engine server's 1-token probe failed: {reply.status_code} {reply.text[:200]}")
