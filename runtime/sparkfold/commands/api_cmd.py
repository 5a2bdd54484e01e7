"""``sparkfold api --config FILE``: run the public gateway (head node)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from sparkfold.commands._options import config_option
from sparkfold.config import Settings

if TYPE_CHECKING:
    from sparkfold.api.capabilities import EngineStart
    from sparkfold.api.health import PeerSource
    from sparkfold.api.metrics import EngineLoad, MemoryKills
    from sparkfold.api.server import Notify


def _notifier() -> Notify:
    """sd_notify from node/ when this tree has it (READY, RELOADING, STOPPING for Type=notify)."""
    try:
        notify: Notify = importlib.import_module("sparkfold.node.notify").notify
    except (ImportError, AttributeError):
        return lambda *states: None
    return notify


def _peer_source() -> PeerSource | None:
    """The peer state this node's engine supervisor records (node/), for engines whose own
    ``/health`` has no peer block (TensorFold)."""
    try:
        source: PeerSource = importlib.import_module("sparkfold.node.peer").recorded_peer
    except (ImportError, AttributeError):
        return None
    return source


def _engine_start() -> EngineStart | None:
    """The pid of the rank this node's engine unit marked serving (node/): a new one is a new start,
    so the gateway asks the engine's capabilities again."""
    return _marked("pid")


def _engine_load() -> EngineLoad | None:
    """How the rank this node's engine unit marked serving started (seconds, phases, first or
    restart; node/)."""
    return _marked(None)


def _memory_kills(settings: Settings) -> MemoryKills | None:
    """How often the memory guard killed this node's rank, from its record (node/)."""
    try:
        guard = importlib.import_module("sparkfold.node.guard")
    except ImportError:
        return None
    path = guard.kills_path(settings)
    return lambda: len(guard.read_kills(path))


def _marked(field: str | None) -> Callable[[], Any] | None:
    """A reader of one field of the serving marker (``None``: all of it; None while no rank is
    marked); None without node/."""
    try:
        serving = importlib.import_module("sparkfold.node.marker").serving
    except (ImportError, AttributeError):
        return None

    def read() -> Any:
        found = serving()
        return found if found is None or field is None else getattr(found, field)

    return read


@click.command()
@config_option
def command(settings: Settings) -> None:
    """Serve the OpenAI/Anthropic API on [api] host:port in front of the engine server."""
    from sparkfold.api import GatewayRefused, serve

    try:
        serve(
            settings,
            notify=_notifier(),
            peer_state=_peer_source(),
            engine_start=_engine_start(),
            engine_load=_engine_load(),
            memory_kills=_memory_kills(settings),
        )
    except GatewayRefused as exc:
        raise click.ClickException(str(exc)) from None
