"""Run the gateway: refuse unsafe starts, log JSON lines, serve with uvicorn, reload keys on SIGHUP.

Service-manager states go through ``notify`` (the caller passes sd_notify; ``api/`` never imports
``node/``): ``READY=1`` once the socket is bound, ``RELOADING=1`` then ``READY=1`` around a key
reload, ``STOPPING=1`` at shutdown.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import uvicorn

from sparkfold.api.app import App, create_app
from sparkfold.api.capabilities import EngineStart
from sparkfold.api.connections import ConnectionLimits, bounded_protocol
from sparkfold.api.errors import UpstreamUnavailable
from sparkfold.api.health import PeerSource
from sparkfold.api.keys import KeyFileError, KeyStore
from sparkfold.api.metrics import EngineLoad, MemoryKills
from sparkfold.config import Settings

__all__ = [
    "GatewayRefused",
    "JsonFormatter",
    "Notify",
    "NotifyingServer",
    "check_keys",
    "configure_logging",
    "require_keys",
    "run_server",
    "serve",
    "uvicorn_config",
]

Notify = Callable[..., object]  # notify("READY=1", "STATUS=...")

log = logging.getLogger(__name__)

_STANDARD = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class GatewayRefused(RuntimeError):
    """The gateway will not start with these settings; the message says what to change."""


class JsonFormatter(logging.Formatter):
    """One JSON object per line (journald keeps them whole): time, level, logger, message, extras."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        data.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)


def require_keys(keys_file: Path | None, *, required: bool, bind: str, default_file: str) -> KeyStore:
    """The key store read from ``keys_file``, or GatewayRefused when it is unreadable, or when keys
    are ``required`` (``bind``, e.g. ``api.host 0.0.0.0``, is not loopback) and it holds none."""
    try:
        keys = KeyStore(keys_file)
    except KeyFileError as exc:
        raise GatewayRefused(str(exc)) from None
    if required and len(keys) == 0:
        where = keys_file or default_file
        field = bind.split()[0]
        raise GatewayRefused(
            f"API keys are required because {bind} is not loopback, but {where} holds none; "
            f"add one (python3 -c 'import secrets; print(secrets.token_urlsafe(32))' >> {where}, "
            f"or a 'sha256:<hex>' line), point {field.split('.')[0]}.api_keys_file at it, "
            f"or bind {field} to 127.0.0.1"
        )
    return keys


def check_keys(settings: Settings) -> KeyStore:
    """The gateway's key store, or GatewayRefused when keys are required and there are none."""
    api = settings.api
    return require_keys(
        api.api_keys_file,
        required=api.keys_required,
        bind=f"api.host {api.host}",
        default_file="/etc/sparkfold/api-keys",
    )


def configure_logging() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)


class NotifyingServer(uvicorn.Server):
    """uvicorn's server, telling the service manager when it is ready and when it stops;
    ``on_stop`` runs first at a stop, before uvicorn waits for open connections."""

    def __init__(
        self, config: uvicorn.Config, notify: Notify, *, on_stop: Callable[[], None] = lambda: None
    ) -> None:
        super().__init__(config)
        self.notify = notify
        self.on_stop = on_stop

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        if self.started:
            self.notify("READY=1", f"STATUS=serving on {self.config.host}:{self.config.port}")

    async def shutdown(self, sockets: Any = None) -> None:
        self.notify("STOPPING=1")
        self.on_stop()
        await super().shutdown(sockets)


def uvicorn_config(settings: Settings, app: App) -> uvicorn.Config:
    """uvicorn's settings for the gateway: its connection limits (:mod:`sparkfold.api.connections`)."""
    api = settings.api
    return uvicorn.Config(
        app,
        host=api.host,
        port=api.port,
        log_config=None,
        access_log=False,
        loop="auto",  # uvloop when it is installed (uvicorn[standard]), else asyncio
        http=bounded_protocol(ConnectionLimits.of(api)),  # httptools, bounded
        timeout_keep_alive=api.idle_timeout_s,  # type: ignore[arg-type]  # uvicorn takes a float
        timeout_graceful_shutdown=api.shutdown_grace_s,  # type: ignore[arg-type]
        backlog=min(api.max_connections, 4096),
    )


def end_streams(app: App) -> None:
    """At a stop: every open stream ends at once with an error event and its end-of-stream (the
    client knows to retry) before uvicorn waits ``api.shutdown_grace_s`` for the rest."""
    error = UpstreamUnavailable("the gateway is restarting; send the request again")
    if count := app.gateway.engine.interrupt_streams(error):
        log.info("open streams ended for the shutdown", extra={"streams": count})


def run_server(
    server: NotifyingServer, *, on_hup: Callable[[], None], starting: str, extra: dict[str, Any]
) -> None:
    """Serve ``server`` until SIGINT/SIGTERM, calling ``on_hup`` at each SIGHUP; logs ``starting``."""

    async def main() -> None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, on_hup)
        log.info(starting, extra=extra)
        await server.serve()

    # server.serve() runs on the caller's loop (only server.run() picks uvicorn's), so the loop
    # is made here from uvicorn's factory: uvloop halves the per-request cost of the event loop
    with asyncio.Runner(loop_factory=server.config.get_loop_factory()) as runner:
        runner.run(main())


def serve(
    settings: Settings,
    *,
    notify: Notify = lambda *states: None,
    peer_state: PeerSource | None = None,
    engine_start: EngineStart | None = None,
    engine_load: EngineLoad | None = None,
    memory_kills: MemoryKills | None = None,
) -> None:
    """Serve until SIGINT/SIGTERM. Raises GatewayRefused before binding when it must not start.

    ``peer_state``: the peer rank's state where the engine's ``/health`` has none (TensorFold);
    ``engine_start``: what identifies the engine's current start (see :mod:`sparkfold.api.capabilities`);
    ``engine_load``: the serving rank's last cold load, ``memory_kills``: the memory guard's kills of
    it (see :mod:`sparkfold.api.metrics`)."""
    check_keys(settings)
    configure_logging()
    app = create_app(
        settings,
        peer_state=peer_state,
        engine_start=engine_start,
        engine_load=engine_load,
        memory_kills=memory_kills,
    )
    # Everything built so far lives as long as the process: moved out of the collector's way, so a
    # full collection no longer walks tens of thousands of framework objects on a request's path.
    gc.freeze()
    server = NotifyingServer(uvicorn_config(settings, app), notify, on_stop=lambda: end_streams(app))

    def reload_keys() -> None:
        notify("RELOADING=1", f"MONOTONIC_USEC={time.monotonic_ns() // 1000}")
        try:
            count = app.gateway.keys.reload()
        except KeyFileError as exc:
            log.error("api keys not reloaded; the old ones stay in force", extra={"error": str(exc)})
        else:
            log.info("api keys reloaded", extra={"keys": count})
        notify("READY=1")

    run_server(
        server,
        on_hup=reload_keys,
        starting="gateway starting",
        extra={"bind": f"{settings.api.host}:{settings.api.port}", "engine": settings.engine_url},
    )
