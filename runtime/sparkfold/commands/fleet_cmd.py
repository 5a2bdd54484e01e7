"""``sparkfold fleet --config FILE``: the fleet's public endpoint (router host)."""

from __future__ import annotations

from pathlib import Path

import click

from sparkfold.commands._options import fleet_option
from sparkfold.fleet.settings import FleetSettings


@click.command()
@fleet_option
@click.option("--check", is_flag=True, help="Validate the file and its key files, then exit.")
def command(fleet: tuple[FleetSettings, Path], check: bool) -> None:
    """Serve the fleet on [front] host:port: our keys, then SMG or a pair behind them."""
    from sparkfold.api.server import GatewayRefused
    from sparkfold.commands.api_cmd import _notifier
    from sparkfold.fleet.server import check_front, serve_front

    settings, path = fleet
    try:
        if check:
            check_front(settings)
            click.echo(f"{path}: ok ({len(settings.pairs)} pairs, {len(settings.serving)} serving)")
            return
        serve_front(settings, path, notify=_notifier())
    except GatewayRefused as exc:
        raise click.ClickException(str(exc)) from None
