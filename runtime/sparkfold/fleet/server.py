"""Run the fleet front: refuse unsafe starts, serve with uvicorn, reload keys and pairs on SIGHUP."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import uvicorn

from sparkfold.api.keys import KeyFileError
from sparkfold.api.server import (
    GatewayRefused,
    Notify,
    NotifyingServer,
    configure_logging,
    require_keys,
    run_server,
)
from sparkfold.config import ConfigError
from sparkfold.fleet.app import FleetApp
from sparkfold.fleet.settings import FleetSettings, load_fleet

__all__ = ["check_front", "serve_front"]

log = logging.getLogger(__name__)


def check_front(fleet: FleetSettings) -> None:
    """GatewayRefused when the front must not start: keys required and none, or a key file unreadable."""
    front = fleet.front
    require_keys(
        front.api_keys_file,
        required=front.keys_required,
        bind=f"front.host {front.host}",
        default_file="/etc/sparkfold/fleet-api-keys",
    )


def serve_front(fleet: FleetSettings, path: Path, *, notify: Notify = lambda *states: None) -> None:
    """Serve until SIGINT/SIGTERM; SIGHUP rereads the keys and ``path``'s ``[[pairs]]``."""
    check_front(fleet)
    configure_logging()
    try:
        app = FleetApp(fleet)
    except ValueError as exc:  # a key file of [router] unreadable or empty
        raise GatewayRefused(str(exc)) from None
    config = uvicorn.Config(
        app,
        host=fleet.front.host,
        port=fleet.front.port,
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=5,
    )
    server = NotifyingServer(config, notify)

    def reload() -> None:
        notify("RELOADING=1", f"MONOTONIC_USEC={time.monotonic_ns() // 1000}")
        try:
            count = app.keys.reload()
            app.reload_pairs(load_fleet(path))
        except (KeyFileError, ConfigError) as exc:
            log.error("fleet not reloaded; the old keys and pairs stay in force", extra={"error": str(exc)})
        else:
            log.info("fleet reloaded", extra={"keys": count, "pairs": [p.name for p in app.view.settings]})
        notify("READY=1")

    run_server(
        server,
        on_hup=reload,
        starting="fleet front starting",
        extra={"bind": f"{fleet.front.host}:{fleet.front.port}"},
    )
