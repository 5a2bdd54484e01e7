"""``sparkfold api --config FILE``: run the public gateway (head node)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

import click

from sparkfold.commands._options import config_option
from sparkfold.config import Settings

if TYPE_CHECKING:
    from sparkfold.api.server import Notify


def _notifier() -> Notify:
    """sd_notify from node/ when this tree has it (READY, RELOADING, STOPPING for Type=notify)."""
    try:
        notify: Notify = importlib.import_module("sparkfold.node.notify").notify
    except (ImportError, AttributeError):
        return lambda *states: None
    return notify


@click.command()
@config_option
def command(settings: Settings) -> None:
    """Serve the OpenAI/Anthropic API on [api] host:port in front of the engine server."""
    from sparkfold.api import GatewayRefused, serve

    try:
        serve(settings, notify=_notifier())
    except GatewayRefused as exc:
        raise click.ClickException(str(exc)) from None
