"""``sparkfold fabric --config FILE [--json]``."""

from __future__ import annotations

from pathlib import Path

import click

from sparkfold.commands._options import config_option, json_option, sysfs_option
from sparkfold.commands._report import emit
from sparkfold.config import Settings
from sparkfold.node.fabric import discover_settled


@click.command()
@config_option
@json_option
@sysfs_option
@click.option("--no-ping", is_flag=True, help="Skip the full-size ping to the peer.")
@click.option(
    "--settle-s",
    type=click.FloatRange(min=0, max=3600),
    default=0,
    show_default=True,
    metavar="SECONDS",
    help="Look again (every 2 s) until the link passes or this long has passed (after netplan apply).",
)
def command(settings: Settings, as_json: bool, sysfs_root: Path, no_ping: bool, settle_s: float) -> None:
    """Discover and prove the link to fabric.peer: netdev, MTU, full-size ping, RDMA device, RoCE v2 GID."""
    report = discover_settled(settings, settle_s, sysfs=sysfs_root, ping=not no_ping)
    emit(report, as_json, "fabric check")
