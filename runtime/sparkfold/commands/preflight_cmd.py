"""``sparkfold preflight --config FILE [--json]``."""

from __future__ import annotations

import click

from sparkfold.commands._options import config_option, json_option
from sparkfold.commands._report import emit
from sparkfold.config import Settings
from sparkfold.node.preflight import DEFAULT_THRESHOLDS, Thresholds, preflight


@click.command()
@config_option
@json_option
@click.option(
    "--min-memory-gib",
    type=float,
    metavar="GIB",
    envvar="SPARKFOLD_MIN_MEMORY_GIB",
    help="Least available memory; default per engine.kind (transformers 1, exllamav3/tensorfold 110).",
)
@click.option(
    "--min-disk-gib",
    type=float,
    metavar="GIB",
    envvar="SPARKFOLD_MIN_DISK_GIB",
    help="Least free disk under paths.state_dir; default per engine.kind.",
)
@click.option(
    "--testbed-arch",
    metavar="ARCH",
    envvar="SPARKFOLD_TESTBED_ARCH",
    help="Testbed only: accept this CPU architecture for any engine.kind (reported as TESTBED OVERRIDE).",
)
def command(
    settings: Settings,
    as_json: bool,
    min_memory_gib: float | None,
    min_disk_gib: float | None,
    testbed_arch: str | None,
) -> None:
    """Check this node can run its engine rank: OS, arch, memory, disk, GPU and Docker where needed."""
    default = DEFAULT_THRESHOLDS[settings.engine.kind]
    thresholds = Thresholds(
        memory_gib=default.memory_gib if min_memory_gib is None else min_memory_gib,
        disk_gib=default.disk_gib if min_disk_gib is None else min_disk_gib,
    )
    emit(preflight(settings, thresholds, testbed_arch=testbed_arch or None), as_json, "preflight")
