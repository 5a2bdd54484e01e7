"""``sparkfold fabric --config FILE [--json]``."""

from __future__ import annotations

from pathlib import Path

import click

from sparkfold.commands._options import config_option, json_option, sysfs_option
from sparkfold.commands._report import emit
from sparkfold.config import Settings
from sparkfold.node.fabric import discover


@click.command()
@config_option
@json_option
@sysfs_option
@click.option("--no-ping", is_flag=True, help="Skip the full-size ping to the peer.")
def command(settings: Settings, as_json: bool, sysfs_root: Path, no_ping: bool) -> None:
    """Discover and prove the link to fabric.peer: netdev, MTU, full-size ping, RDMA device, RoCE v2 GID."""
    emit(discover(settings, sysfs=sysfs_root, ping=not no_ping), as_json, "fabric check")
