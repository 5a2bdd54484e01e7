"""``sparkfold doctor [--config FILE] [--json]``."""

from __future__ import annotations

from pathlib import Path

import click

from sparkfold.commands._options import echo_json, json_option, sysfs_option
from sparkfold.config import DEFAULT_CONFIG_PATH
from sparkfold.node.doctor import DEFAULT_TIMEOUT_S, Doctor, as_dict, as_table, bounded_runner


@click.command()
@click.option(
    "--config",
    type=click.Path(dir_okay=False, path_type=Path),
    default=DEFAULT_CONFIG_PATH,
    show_default=True,
    metavar="FILE",
    envvar="SPARKFOLD_CONFIG",
    help="The node's sparkfold.toml (an invalid or missing file is reported, not fatal).",
)
@sysfs_option
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=0.1),
    default=DEFAULT_TIMEOUT_S,
    show_default=True,
    metavar="SECONDS",
    help="Limit of each probe command.",
)
@json_option
def command(config: Path, sysfs_root: Path, timeout_s: float, as_json: bool) -> None:
    """Gather what a bug report needs from this node: version, config, fabric, RDMA, memory, GPU,
    Docker and the engine image, weights, units, recent errors. Changes nothing; secrets are masked."""
    sections = Doctor(config, sysfs=sysfs_root, run=bounded_runner(timeout_s)).gather()
    if as_json:
        echo_json(as_dict(sections))
    else:
        click.echo(as_table(sections), nl=False)
